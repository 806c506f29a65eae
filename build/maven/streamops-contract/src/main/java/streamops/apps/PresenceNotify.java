package streamops.apps;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.io.StringWriter;
import java.io.UncheckedIOException;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.function.FlatMapGroupsWithStateFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.GroupState;
import org.apache.spark.sql.streaming.GroupStateTimeout;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The presence notifier's per-user state (spark_apps/presence_notifier.py, query "notify") on the
 * JVM: Spark calls it once per user and micro-batch with that user's rows, beside the user's
 * presence history kept in Spark's state store. The Python function notify_user is the reference
 * this follows rule for rule; tests/test_presence_notifier.py compares the two on generated input.
 *
 * <p>Why Java: with applyInPandasWithState every row crosses to a Python worker and back through
 * Arrow, and the history through JSON text (PySpark 4.0 could not hand array-typed state to Python); at
 * 10,000 events/s on two cores that round trip is where the notify query falls behind.
 *
 * <p>Input rows: user_id string, kind int (0 presence, 1 tick), time_ms bigint, action string (a
 * presence's Open or Close, null for a tick), event_id string, partition int, offset bigint.
 * Output rows: key string, value string (JSON), topic string. State: history, an array of
 * (time_ms, action, event_id) sorted by time, none of them null: the input contract lets through
 * presence events with an action of Open or Close only, and every record has its event id.
 */
public final class PresenceNotify implements FlatMapGroupsWithStateFunction<String, Row, Row, Row> {
  private static final long serialVersionUID = 1L;

  /**
   * The version of these rules. The Python side compares it with the one it expects, so an app
   * whose code pins a version never runs against a jar whose rules differ.
   */
  public static final String LOGIC_VERSION = "1";

  /** LOGIC_VERSION, for the Python side (streamops.jvm_functions.require_version). */
  public static String logicVersion() {
    return LOGIC_VERSION;
  }

  public static final StructType OUTPUT_SCHEMA =
      new StructType().add("key", DataTypes.StringType).add("value", DataTypes.StringType).add("topic", DataTypes.StringType);

  public static final StructType ENTRY_SCHEMA =
      new StructType()
          .add("time_ms", DataTypes.LongType, false)
          .add("action", DataTypes.StringType, false)
          .add("event_id", DataTypes.StringType, false);

  public static final StructType STATE_SCHEMA =
      new StructType().add("history", DataTypes.createArrayType(ENTRY_SCHEMA, false), false);

  private static final int PRESENCE = 0;
  private static final DateTimeFormatter ISO_MS =
      DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSS'Z'").withZone(ZoneOffset.UTC);
  private static final JsonFactory JSON = new JsonFactory();

  private final String message;
  private final long horizonMs;
  private final String notificationsTopic;
  private final String latestStateTopic;

  public PresenceNotify(String message, long horizonMs, String notificationsTopic, String latestStateTopic) {
    this.message = message;
    this.horizonMs = horizonMs;
    this.notificationsTopic = notificationsTopic;
    this.latestStateTopic = latestStateTopic;
  }

  /**
   * The notify query's per-user step over `inputs` (the columns above), grouped by user_id: what
   * streamops calls from Python through the driver's JVM.
   */
  public static Dataset<Row> apply(
      Dataset<Row> inputs, String message, long horizonMs, String notificationsTopic, String latestStateTopic) {
    Encoder<String> keys = Encoders.STRING();
    Encoder<Row> rows = Encoders.row(inputs.schema());
    return inputs
        .groupBy("user_id")
        .as(keys, rows)
        .flatMapGroupsWithState(
            new PresenceNotify(message, horizonMs, notificationsTopic, latestStateTopic),
            OutputMode.Append(),
            Encoders.row(STATE_SCHEMA),
            Encoders.row(OUTPUT_SCHEMA),
            GroupStateTimeout.NoTimeout());
  }

  /** One presence-history entry. */
  record Entry(long timeMs, String action, String eventId) {}

  /** One input row of a user. */
  record Input(int kind, long timeMs, String action, String eventId, int partition, long offset) {}

  /** What one call gives: the output rows (key, value, topic) and the new history. */
  record Step(List<String[]> outputs, List<Entry> history) {}

  // The reference sorts the history as Python tuples: by time, then action, then event id.
  private static final Comparator<Entry> HISTORY_ORDER =
      Comparator.comparingLong(Entry::timeMs).thenComparing(Entry::action).thenComparing(Entry::eventId);
  // At equal event times a presence event applies before a tick; then the input's own order.
  private static final Comparator<Input> INPUT_ORDER =
      Comparator.comparingLong(Input::timeMs)
          .thenComparingInt(Input::kind)
          .thenComparingInt(Input::partition)
          .thenComparingLong(Input::offset);

  @Override
  public Iterator<Row> call(String userId, Iterator<Row> values, GroupState<Row> state) {
    List<Entry> history = new ArrayList<>();
    if (state.exists()) {
      for (Row entry : state.get().<Row>getList(0)) {
        history.add(new Entry(entry.getLong(0), entry.getString(1), entry.getString(2)));
      }
    }
    List<Input> inputs = new ArrayList<>();
    while (values.hasNext()) {
      Row row = values.next();
      inputs.add(
          new Input(
              row.<Number>getAs("kind").intValue(),
              row.<Number>getAs("time_ms").longValue(),
              row.<String>getAs("action"),
              row.<String>getAs("event_id"),
              row.<Number>getAs("partition").intValue(),
              row.<Number>getAs("offset").longValue()));
    }
    Step step = step(userId, inputs, history);
    List<Row> kept = new ArrayList<>(step.history().size());
    for (Entry entry : step.history()) {
      kept.add(RowFactory.create(entry.timeMs(), entry.action(), entry.eventId()));
    }
    // A Row's array field is a Scala Seq for Spark's row encoder (a java.util.List is refused).
    state.update(RowFactory.create(CollectionConverters.asScala(kept)));
    List<Row> outputs = new ArrayList<>(step.outputs().size());
    for (String[] output : step.outputs()) {
      outputs.add(RowFactory.create((Object[]) output));
    }
    return outputs.iterator();
  }

  /** notify_user's rules: one user's rows of one micro-batch against their history. */
  Step step(String userId, List<Input> rows, List<Entry> previous) {
    List<Entry> history = new ArrayList<>(previous);
    history.sort(HISTORY_ORDER);
    Long latestBefore = history.isEmpty() ? null : history.get(history.size() - 1).timeMs();
    List<String[]> outputs = new ArrayList<>();
    List<Input> ordered = new ArrayList<>(rows);
    ordered.sort(INPUT_ORDER);
    for (Input row : ordered) {
      if (row.kind() == PRESENCE) {
        Entry entry = new Entry(row.timeMs(), row.action(), row.eventId());
        int at = insertionPoint(history, entry);
        history.add(at, entry);
        if ("Close".equals(row.action())) {
          outputs.add(notification(userId, row.eventId(), "close", row.timeMs(), row.eventId()));
        }
      } else {
        Entry current = latestAtOrBefore(history, row.timeMs());
        if (current != null && "Close".equals(current.action())) {
          outputs.add(notification(userId, row.eventId(), "tick", row.timeMs(), current.eventId()));
        }
      }
    }
    if (!history.isEmpty()) {
      Entry newest = history.get(history.size() - 1);
      if (latestBefore == null || newest.timeMs() > latestBefore) {
        outputs.add(new String[] {userId, latestState(userId, newest), latestStateTopic});
      }
      // Kept: everything younger than the horizon behind the newest event, and the last entry
      // older than that, which is the state that held at the horizon.
      long cutoff = newest.timeMs() - horizonMs;
      int firstKept = 0;
      while (firstKept < history.size() && history.get(firstKept).timeMs() < cutoff) {
        firstKept++;
      }
      history = new ArrayList<>(history.subList(Math.max(0, firstKept - 1), history.size()));
    }
    return new Step(outputs, history);
  }

  private static int insertionPoint(List<Entry> history, Entry entry) {
    int low = 0;
    int high = history.size();
    while (low < high) { // the first position whose entry sorts after this one: after its equals
      int mid = (low + high) >>> 1;
      if (HISTORY_ORDER.compare(history.get(mid), entry) <= 0) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    return low;
  }

  private static Entry latestAtOrBefore(List<Entry> history, long timeMs) {
    int low = 0;
    int high = history.size();
    while (low < high) { // the number of entries at or before timeMs
      int mid = (low + high) >>> 1;
      if (history.get(mid).timeMs() <= timeMs) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    return low == 0 ? null : history.get(low - 1);
  }

  private String[] notification(String userId, String sourceId, String cause, long timeMs, String presenceId) {
    String value =
        json(
            "notification_id", sourceId,
            "user_id", userId,
            "message", message,
            "cause", cause,
            "event_time", ISO_MS.format(Instant.ofEpochMilli(timeMs)),
            "source_event_id", sourceId,
            "presence_event_id", presenceId);
    return new String[] {userId, value, notificationsTopic};
  }

  private static String latestState(String userId, Entry newest) {
    return json(
        "user_id", userId,
        "action", newest.action(),
        "event_time", ISO_MS.format(Instant.ofEpochMilli(newest.timeMs())),
        "event_id", newest.eventId());
  }

  /** A JSON object of string members, in the order given (name, value, name, value, ...). */
  private static String json(String... members) {
    StringWriter text = new StringWriter(64 + 16 * members.length);
    try (JsonGenerator out = JSON.createGenerator(text)) {
      out.writeStartObject();
      for (int i = 0; i < members.length; i += 2) {
        out.writeStringField(members[i], members[i + 1]);
      }
      out.writeEndObject();
    } catch (IOException error) {
      throw new UncheckedIOException(error); // a StringWriter does not fail
    }
    return text.toString();
  }

  /**
   * The step on JSON text, for the differential test against the Python reference (through the
   * driver's JVM): rows [[kind, time_ms, action, event_id, partition, offset], ...], history
   * [[time_ms, action, event_id], ...]; returns {"outputs": [[key, value, topic], ...], "history":
   * [...]}.
   */
  public static String stepJson(
      String userId, String rowsJson, String historyJson, String message, long horizonMs,
      String notificationsTopic, String latestStateTopic) throws IOException {
    List<Input> rows = new ArrayList<>();
    for (List<Object> row : arrays(rowsJson)) {
      rows.add(new Input(((Number) row.get(0)).intValue(), ((Number) row.get(1)).longValue(), (String) row.get(2),
          (String) row.get(3), ((Number) row.get(4)).intValue(), ((Number) row.get(5)).longValue()));
    }
    List<Entry> history = new ArrayList<>();
    for (List<Object> entry : arrays(historyJson)) {
      history.add(new Entry(((Number) entry.get(0)).longValue(), (String) entry.get(1), (String) entry.get(2)));
    }
    Step step = new PresenceNotify(message, horizonMs, notificationsTopic, latestStateTopic).step(userId, rows, history);
    StringWriter text = new StringWriter();
    try (JsonGenerator out = JSON.createGenerator(text)) {
      out.writeStartObject();
      out.writeArrayFieldStart("outputs");
      for (String[] output : step.outputs()) {
        out.writeArray(output, 0, output.length);
      }
      out.writeEndArray();
      out.writeArrayFieldStart("history");
      for (Entry entry : step.history()) {
        out.writeStartArray();
        out.writeNumber(entry.timeMs());
        out.writeString(entry.action());
        out.writeString(entry.eventId());
        out.writeEndArray();
      }
      out.writeEndArray();
      out.writeEndObject();
    }
    return text.toString();
  }

  /** A JSON array of arrays of scalars (numbers as Long, strings, nulls). */
  private static List<List<Object>> arrays(String text) throws IOException {
    List<List<Object>> all = new ArrayList<>();
    try (JsonParser in = JSON.createParser(text)) {
      expect(in.nextToken(), JsonToken.START_ARRAY);
      while (in.nextToken() == JsonToken.START_ARRAY) {
        List<Object> items = new ArrayList<>();
        for (JsonToken token = in.nextToken(); token != JsonToken.END_ARRAY; token = in.nextToken()) {
          switch (token) {
            case VALUE_NUMBER_INT -> items.add(in.getLongValue());
            case VALUE_STRING -> items.add(in.getText());
            case VALUE_NULL -> items.add(null);
            default -> throw new IOException("stepJson: a scalar expected, got " + token);
          }
        }
        all.add(items);
      }
    }
    return all;
  }

  private static void expect(JsonToken got, JsonToken wanted) throws IOException {
    if (got != wanted) {
      throw new IOException("stepJson: " + wanted + " expected, got " + got);
    }
  }
}

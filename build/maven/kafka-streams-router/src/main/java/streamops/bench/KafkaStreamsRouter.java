package streamops.bench;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.regex.Pattern;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;

/**
 * The oplog router's routing as a Kafka Streams app, the reference `streamops bench report`
 * compares the Spark router with. Same input, same output shape, the same main rules of the
 * input contract as the bench's Python loop (a JSON object; seq an integer; user_id and op_type
 * non-empty strings; event_time a date-time with an offset; the key equal to user_id; an op type
 * some category holds; at most max-record-bytes): a record failing one is a dead letter naming
 * its source record. One stream thread, at-least-once (the defaults a team starts from).
 *
 * <p>Arguments: client-properties-file application-id input-topic dead-letter-topic app-name max-record-bytes
 * state-dir route... where each route is op_type=category:topic.
 */
public final class KafkaStreamsRouter {
  private static final ObjectMapper JSON = new ObjectMapper()
      .enable(JsonParser.Feature.STRICT_DUPLICATE_DETECTION);
  private static final Pattern HAS_OFFSET = Pattern.compile("(Z|z|[+-][0-9]{2}:?[0-9]{2})$");
  private static final DateTimeFormatter OUT_TIME = DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm:ss.SSSXXX");

  record Target(String category, String topic) {}

  /** A record routed to a topic (the topic travels with the value to the topic extractor). */
  record Routed(String topic, byte[] value) {}

  public static void main(String[] args) throws Exception {
    if (args.length < 8) {
      System.err.println("usage: client.properties application-id input dead-letters app max-bytes state-dir op=category:topic...");
      System.exit(2);
    }
    String input = args[2];
    String deadLetters = args[3];
    String app = args[4];
    int maxBytes = Integer.parseInt(args[5]);
    Map<String, List<Target>> routes = new HashMap<>();
    for (String route : Arrays.copyOfRange(args, 7, args.length)) {
      String[] opAndTarget = route.split("=", 2);
      String[] categoryAndTopic = opAndTarget[1].split(":", 2);
      routes.computeIfAbsent(opAndTarget[0], k -> new ArrayList<>())
          .add(new Target(categoryAndTopic[0], categoryAndTopic[1]));
    }
    // The connection (bootstrap servers, security) as the suite's Java clients get it.
    Properties props = new Properties();
    try (var in = java.nio.file.Files.newInputStream(java.nio.file.Path.of(args[0]))) {
      props.load(in);
    }
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[6]);
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
    // Commit every second (default 30 s), so the bench sees the end of the drain soon after it.
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    // The same producer durability as the suite's sink (acks=all, idempotent).
    props.put(StreamsConfig.producerPrefix("acks"), "all");
    props.put(StreamsConfig.producerPrefix("enable.idempotence"), "true");

    // Written only: the deserializer is never called.
    Serializer<Routed> routedValue = (topic, routed) -> routed.value();
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
        .process(() -> new RouteProcessor(routes, deadLetters, app, maxBytes))
        .to((key, routed, context) -> routed.topic(), Produced.with(Serdes.ByteArray(), Serdes.serdeFrom(routedValue, (topic, data) -> null)));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch done = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      streams.close();
      done.countDown();
    }));
    streams.start();
    System.out.println("started " + args[1]);
    done.await();
  }

  static final class RouteProcessor implements Processor<byte[], byte[], byte[], Routed> {
    private final Map<String, List<Target>> routes;
    private final String deadLetters;
    private final String app;
    private final int maxBytes;
    private ProcessorContext<byte[], Routed> context;

    RouteProcessor(Map<String, List<Target>> routes, String deadLetters, String app, int maxBytes) {
      this.routes = routes;
      this.deadLetters = deadLetters;
      this.app = app;
      this.maxBytes = maxBytes;
    }

    @Override
    public void init(ProcessorContext<byte[], Routed> context) {
      this.context = context;
    }

    @Override
    public void process(Record<byte[], byte[]> record) {
      var meta = context.recordMetadata().orElseThrow();
      String eventId = meta.topic() + "/" + meta.partition() + "/" + meta.offset();
      byte[] value = record.value();
      JsonNode event = null;
      if (value != null && value.length <= maxBytes) {
        try {
          event = JSON.readTree(value);
        } catch (Exception malformed) {
          event = null;
        }
      }
      List<Target> targets = null;
      String eventTime = null;
      if (event != null && event.isObject()
          && event.path("seq").isIntegralNumber()
          && event.path("user_id").isTextual() && !event.path("user_id").asText().isEmpty()
          && event.path("op_type").isTextual() && !event.path("op_type").asText().isEmpty()
          && event.path("event_time").isTextual()
          && HAS_OFFSET.matcher(event.path("event_time").asText()).find()
          && record.key() != null
          && Arrays.equals(record.key(), event.path("user_id").asText().getBytes(StandardCharsets.UTF_8))) {
        targets = routes.get(event.path("op_type").asText());
        try {
          eventTime = OffsetDateTime.parse(event.path("event_time").asText())
              .withOffsetSameInstant(ZoneOffset.UTC).format(OUT_TIME);
        } catch (Exception badTime) {
          targets = null;
        }
      }
      if (targets == null) {
        ObjectNode envelope = JSON.createObjectNode().put("app", app).put("reason", "invalid");
        envelope.putObject("source").put("topic", meta.topic()).put("partition", meta.partition()).put("offset", meta.offset());
        context.forward(record.withValue(new Routed(deadLetters, bytes(envelope))));
        return;
      }
      String original = new String(value, StandardCharsets.UTF_8).strip();
      for (Target target : targets) {
        ObjectNode head = JSON.createObjectNode()
            .put("event_id", eventId)
            .put("category", target.category())
            .put("seq", event.path("seq").asLong())
            .put("user_id", event.path("user_id").asText())
            .put("op_type", event.path("op_type").asText())
            .put("event_time", eventTime);
        String text = new String(bytes(head), StandardCharsets.UTF_8);
        // "event" is the original JSON text, byte for byte, as the Spark router writes it.
        String routed = text.substring(0, text.length() - 1) + ",\"event\":" + original + "}";
        context.forward(record.withValue(new Routed(target.topic(), routed.getBytes(StandardCharsets.UTF_8))));
      }
    }

    private static byte[] bytes(JsonNode node) {
      try {
        return JSON.writeValueAsBytes(node);
      } catch (Exception impossible) {
        throw new IllegalStateException(impossible);
      }
    }
  }
}

package streamops.contract;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadFeature;
import java.io.IOException;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF3;

/**
 * The JSON-level rules of the suite's input contract in one pass over a record's value, and its
 * required top-level fields, typed: the fast path of streamops.records.parse (Python).
 *
 * <p>call(value, maxDepth, spec) returns a row of the fields' values (a Long for an integer field,
 * a String for a string field, in the order of spec) when the value is one JSON object (RFC 8259,
 * with Spark's own Jackson and its limits), nested at most maxDepth levels, with no member name
 * twice in any object, no lone surrogate escape, nothing but whitespace after it, and every field
 * of spec present at the top level with its exact JSON type (an integer: an integral JSON number
 * within int64, no 1.0 or 1e3; a string: a JSON string). Otherwise it returns null, and the caller
 * runs Spark's own checks, which decide whether the record is good and name the rule it breaks.
 *
 * <p>So null only ever costs time: a record is never refused here. What must never happen is a
 * row for a value Spark's checks refuse; tests/test_strict_input.py compares
 * the two on every hostile record of the strict-input tests and on generated ones.
 *
 * <p>spec: comma-separated "L:name" (integer) or "S:name" (string), empty for none; names are plain identifiers
 * (the Python side uses this path only then).
 */
public final class StrictJsonFields implements UDF3<byte[], Integer, String, Row> {
  private static final long serialVersionUID = 1L;

  // Spark's VARIANT parser is `new JsonFactory()` with its defaults (no NaN, no comments, no single
  // quotes, no unescaped control characters, the default StreamReadConstraints); duplicate names
  // are refused here by Jackson itself, at any depth.
  private static final JsonFactory FACTORY =
      JsonFactory.builder()
          .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION)
          .disable(StreamReadFeature.INCLUDE_SOURCE_IN_LOCATION)
          .build();

  /**
   * Values longer than this go to Spark's checks: Spark builds a VARIANT of every value it parses
   * and refuses one over 16 MiB (a value of small elements takes up to about 3 bytes of VARIANT per
   * byte of text), and it decodes every string against Jackson's 20,000,000-character limit, which
   * this pass does not decode. 2 MiB keeps far from both.
   */
  private static final int MAX_VALUE_BYTES = 2 * 1024 * 1024;

  /**
   * Documents with more member names than this go to Spark's checks: Spark's parser reads a String
   * and files names in a table that refuses more than 150 names of one hash (a guard against
   * crafted collisions); this pass reads bytes, whose table hashes otherwise. With at most this
   * many names in the document no chain can reach that limit.
   */
  private static final int MAX_NAMES = 100;

  /** The parsed spec, published as one reference (a UDF instance may serve several threads). */
  private transient volatile Spec parsed;

  private static final class Spec {
    final String text;
    final String[] names;
    final boolean[] integer;

    Spec(String text) {
      String[] parts = text.isEmpty() ? new String[0] : text.split(",", -1);
      names = new String[parts.length];
      integer = new boolean[parts.length];
      for (int i = 0; i < parts.length; i++) {
        if (parts[i].length() < 3 || parts[i].charAt(1) != ':' || "LS".indexOf(parts[i].charAt(0)) < 0) {
          throw new IllegalArgumentException("StrictJsonFields: a field spec is L:name or S:name, got '" + parts[i] + "'");
        }
        integer[i] = parts[i].charAt(0) == 'L';
        names[i] = parts[i].substring(2);
      }
      this.text = text;
    }
  }

  @Override
  public Row call(byte[] value, Integer maxDepth, String spec) {
    if (value == null || maxDepth == null || spec == null || value.length > MAX_VALUE_BYTES
        || !utf8WithoutMarkers(value)) {
      return null;
    }
    Spec fields = parsed;
    if (fields == null || !fields.text.equals(spec)) {
      fields = new Spec(spec);
      parsed = fields;
    }
    String[] names = fields.names;
    boolean[] integer = fields.integer;
    Object[] found = new Object[names.length];
    int namesSeen = 0;
    boolean escapes = hasUnicodeEscape(value);
    try (JsonParser parser = FACTORY.createParser(value)) {
      if (parser.nextToken() != JsonToken.START_OBJECT || maxDepth < 1) {
        return null;
      }
      int depth = 1;
      while (depth > 0) {
        JsonToken token = parser.nextToken();
        if (token == null) {
          return null;
        }
        switch (token) {
          case START_OBJECT:
          case START_ARRAY:
            if (++depth > maxDepth) {
              return null;
            }
            break;
          case END_OBJECT:
          case END_ARRAY:
            depth--;
            break;
          case FIELD_NAME:
            if (++namesSeen > MAX_NAMES) {
              return null;
            }
            String name = parser.currentName();
            if (escapes && hasLoneSurrogate(name)) {
              return null;
            }
            int field = depth == 1 ? indexOf(names, name) : -1;
            if (field >= 0 && !readField(parser, integer[field], field, found, escapes)) {
              return null;
            }
            break;
          case VALUE_STRING:
            if (escapes && hasLoneSurrogate(parser.getText())) {
              return null;
            }
            break;
          default:
            break;
        }
      }
      if (parser.nextToken() != null) {
        return null; // a second value after the object
      }
    } catch (IOException | RuntimeException notStrictJson) {
      return null; // not JSON, a name twice, past a parser limit, content after the value
    }
    for (Object fieldValue : found) {
      if (fieldValue == null) {
        return null;
      }
    }
    return RowFactory.create(found);
  }

  /** The field's value read into found[field]; false when its JSON type is not the field's. */
  private static boolean readField(JsonParser parser, boolean integer, int field, Object[] found, boolean escapes)
      throws IOException {
    JsonToken token = parser.nextToken();
    if (integer) {
      if (token != JsonToken.VALUE_NUMBER_INT || parser.getNumberType() == JsonParser.NumberType.BIG_INTEGER) {
        return false;
      }
      found[field] = parser.getLongValue();
      return true;
    }
    if (token != JsonToken.VALUE_STRING) {
      return false;
    }
    String text = parser.getText();
    if (escapes && hasLoneSurrogate(text)) {
      return false;
    }
    found[field] = text;
    return true;
  }

  private static int indexOf(String[] names, String name) {
    for (int i = 0; i < names.length; i++) {
      if (names[i].equals(name)) {
        return i;
      }
    }
    return -1;
  }

  /**
   * Jackson reads bytes as UTF-8 unless their start looks like a byte order mark or UTF-16/32 (NUL
   * bytes among the first four). Neither starts valid input (a BOM is refused, a NUL is never JSON
   * text), so those values go to Spark's checks instead of to Jackson's detection.
   */
  private static boolean utf8WithoutMarkers(byte[] value) {
    if (value.length == 0) {
      return false;
    }
    int first = value[0] & 0xFF;
    if (first == 0xEF || first == 0xFE || first == 0xFF) {
      return false;
    }
    for (int i = 0; i < Math.min(4, value.length); i++) {
      if (value[i] == 0) {
        return false;
      }
    }
    return true;
  }

  /** A backslash followed by 'u' anywhere: only then can a string hold a surrogate escape. */
  private static boolean hasUnicodeEscape(byte[] value) {
    for (int i = 0; i + 1 < value.length; i++) {
      if (value[i] == '\\' && value[i + 1] == 'u') {
        return true;
      }
    }
    return false;
  }

  private static boolean hasLoneSurrogate(String text) {
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (Character.isHighSurrogate(c)) {
        if (i + 1 < text.length() && Character.isLowSurrogate(text.charAt(i + 1))) {
          i++;
        } else {
          return true;
        }
      } else if (Character.isLowSurrogate(c)) {
        return true;
      }
    }
    return false;
  }
}

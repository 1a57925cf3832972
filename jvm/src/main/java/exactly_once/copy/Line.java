package exactly_once.copy;

import java.util.Arrays;

/** A growable byte buffer: one row of COPY's text or binary format, or one value before it is escaped. */
final class Line {
  private byte[] bytes = new byte[256];
  private int size;

  byte[] bytes() {
    return bytes;
  }

  int size() {
    return size;
  }

  void reset() {
    size = 0;
  }

  void put(byte b) {
    if (size == bytes.length) {
      bytes = Arrays.copyOf(bytes, bytes.length * 2);
    }
    bytes[size++] = b;
  }

  void put(byte[] from) {
    if (size + from.length > bytes.length) {
      bytes = Arrays.copyOf(bytes, Math.max(bytes.length * 2, size + from.length));
    }
    System.arraycopy(from, 0, bytes, size, from.length);
    size += from.length;
  }

  /** Big-endian, as COPY's binary format and every type's binary form hold numbers. */
  void putShort(int value) {
    put((byte) (value >>> 8));
    put((byte) value);
  }

  void putInt(int value) {
    putShort(value >>> 16);
    putShort(value);
  }

  void putLong(long value) {
    putInt((int) (value >>> 32));
    putInt((int) value);
  }

  /** Text of ASCII characters only (numbers, dates, keywords). */
  void ascii(CharSequence text) {
    for (int i = 0; i < text.length(); i++) {
      put((byte) text.charAt(i));
    }
  }

  /** A value, escaped as COPY's text format reads it back. */
  void escaped(Line value) {
    for (int i = 0; i < value.size; i++) {
      byte b = value.bytes[i];
      switch (b) {
        case '\\' -> { put((byte) '\\'); put((byte) '\\'); }
        case '\t' -> { put((byte) '\\'); put((byte) 't'); }
        case '\n' -> { put((byte) '\\'); put((byte) 'n'); }
        case '\r' -> { put((byte) '\\'); put((byte) 'r'); }
        default -> put(b);
      }
    }
  }

  /** An array element, double-quoted as an array literal reads it back. */
  void quoted(Line value) {
    put((byte) '"');
    for (int i = 0; i < value.size; i++) {
      byte b = value.bytes[i];
      if (b == '"' || b == '\\') {
        put((byte) '\\');
      }
      put(b);
    }
    put((byte) '"');
  }
}

// Every KServe v2 datatype with sample values in JSON and binary form, for round-trip tests.
export const CONFIG_DATATYPE_NAMES = {
  BOOL: 'TYPE_BOOL', UINT8: 'TYPE_UINT8', UINT16: 'TYPE_UINT16', UINT32: 'TYPE_UINT32', UINT64: 'TYPE_UINT64',
  INT8: 'TYPE_INT8', INT16: 'TYPE_INT16', INT32: 'TYPE_INT32', INT64: 'TYPE_INT64',
  FP16: 'TYPE_FP16', FP32: 'TYPE_FP32', FP64: 'TYPE_FP64', BF16: 'TYPE_BF16', BYTES: 'TYPE_STRING',
} as const;

export interface DatatypeSample {
  /** JSON data, or null where JSON is not allowed (FP16, BF16). */
  json: Array<number | boolean | string> | null;
  /** The same values little-endian. */
  binary: Buffer;
}

const le = (bytesPerElement: number, write: (buf: Buffer, value: number, offset: number) => void, values: number[]) => {
  const buf = Buffer.alloc(values.length * bytesPerElement);
  values.forEach((value, i) => write(buf, value, i * bytesPerElement));
  return buf;
};

/** BYTES elements as the wire writes them: uint32 little-endian length, then the bytes. */
export function serializeBytes(elements: string[]): Buffer {
  return Buffer.concat(elements.flatMap((element) => {
    const bytes = Buffer.from(element);
    const length = Buffer.alloc(4);
    length.writeUInt32LE(bytes.byteLength);
    return [length, bytes];
  }));
}

export const SAMPLES: Record<keyof typeof CONFIG_DATATYPE_NAMES, DatatypeSample> = {
  BOOL: { json: [true, false, true], binary: Buffer.from([1, 0, 1]) },
  UINT8: { json: [0, 7, 255], binary: Buffer.from([0, 7, 255]) },
  UINT16: { json: [0, 700, 65535], binary: le(2, (b, v, o) => b.writeUInt16LE(v, o), [0, 700, 65535]) },
  UINT32: { json: [0, 70000, 4294967295], binary: le(4, (b, v, o) => b.writeUInt32LE(v, o), [0, 70000, 4294967295]) },
  UINT64: { json: [0, 1, 9007199254740991], binary: le(8, (b, v, o) => b.writeBigUInt64LE(BigInt(v), o), [0, 1, 9007199254740991]) },
  INT8: { json: [-128, 0, 127], binary: le(1, (b, v, o) => b.writeInt8(v, o), [-128, 0, 127]) },
  INT16: { json: [-32768, 5, 32767], binary: le(2, (b, v, o) => b.writeInt16LE(v, o), [-32768, 5, 32767]) },
  INT32: { json: [-2147483648, 5, 2147483647], binary: le(4, (b, v, o) => b.writeInt32LE(v, o), [-2147483648, 5, 2147483647]) },
  INT64: { json: [-9007199254740991, 5, 9007199254740991], binary: le(8, (b, v, o) => b.writeBigInt64LE(BigInt(v), o), [-9007199254740991, 5, 9007199254740991]) },
  // 1.0, -2.0, 65504 in IEEE half; 1.0, -2.0, 3.0 in bfloat16.
  FP16: { json: null, binary: le(2, (b, v, o) => b.writeUInt16LE(v, o), [0x3c00, 0xc000, 0x7bff]) },
  FP32: { json: [1.5, -2.25, 1e10], binary: le(4, (b, v, o) => b.writeFloatLE(v, o), [1.5, -2.25, 1e10]) },
  FP64: { json: [1.5, -2.25, 1e300], binary: le(8, (b, v, o) => b.writeDoubleLE(v, o), [1.5, -2.25, 1e300]) },
  BF16: { json: null, binary: le(2, (b, v, o) => b.writeUInt16LE(v, o), [0x3f80, 0xc000, 0x4040]) },
  BYTES: { json: ['héllo', '', 'a\u0000b'], binary: serializeBytes(['héllo', '', 'a\u0000b']) },
};

// KServe v2 datatypes: the protocol strings, their model-config enum names (TYPE_*) and sizes.
// BYTES is TYPE_STRING in configs and has no fixed size.

export const DATATYPES = [
  'BOOL', 'UINT8', 'UINT16', 'UINT32', 'UINT64', 'INT8', 'INT16', 'INT32', 'INT64',
  'FP16', 'FP32', 'FP64', 'BF16', 'BYTES',
] as const;
export type DataType = (typeof DATATYPES)[number];

/** model_config.proto's enum DataType names, in the same order as DATATYPES. */
export const CONFIG_DATATYPES = [
  'TYPE_BOOL', 'TYPE_UINT8', 'TYPE_UINT16', 'TYPE_UINT32', 'TYPE_UINT64', 'TYPE_INT8', 'TYPE_INT16', 'TYPE_INT32', 'TYPE_INT64',
  'TYPE_FP16', 'TYPE_FP32', 'TYPE_FP64', 'TYPE_BF16', 'TYPE_STRING',
] as const;
export type ConfigDataType = (typeof CONFIG_DATATYPES)[number];

const BYTES_PER_ELEMENT: Record<DataType, number> = {
  BOOL: 1, UINT8: 1, UINT16: 2, UINT32: 4, UINT64: 8, INT8: 1, INT16: 2, INT32: 4, INT64: 8,
  FP16: 2, FP32: 4, FP64: 8, BF16: 2, BYTES: 0,
};

export function isDataType(value: string): value is DataType {
  return (DATATYPES as readonly string[]).includes(value);
}

export function fromConfigDataType(type: ConfigDataType): DataType {
  return DATATYPES[CONFIG_DATATYPES.indexOf(type)];
}

export function toConfigDataType(type: DataType): ConfigDataType {
  return CONFIG_DATATYPES[DATATYPES.indexOf(type)];
}

/** Bytes per element; 0 for BYTES, whose elements carry their own length. */
export function bytesPerElement(type: DataType): number {
  return BYTES_PER_ELEMENT[type];
}

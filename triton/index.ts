// What the gateway may import of ordinary-model serving: the repository, plain tensors and the
// conversions of their wire forms, the error type and the statistics shape.
export type { TensorMap } from './backend.ts';
export { classify } from './classification.ts';
export { bytesPerElement, isDataType, fromConfigDataType, type DataType } from './datatype.ts';
export { ClassicError, type ClassicStatus } from './errors.ts';
export { ModelConfigError, modelConfigSchema, type ModelConfig } from './model-config.ts';
export { ModelRepository, type ModelControlMode, type ModelIndexEntry, type RepositoryOptions } from './repository.ts';
export type { InferRequest, ServedVersion } from './served-version.ts';
export type { SequenceFlags } from './batcher.ts';
export { FAILURE_REASONS, StatsRecorder, type FailureReason, type ModelStatistics } from './stats.ts';
export { traceNs, type TraceActivity, type TraceTimestamp } from './trace.ts';
export { elementCount, fromJson, fromRaw, rawByteLength, toJson, toRaw, TensorError, writeRaw, type Tensor } from './tensor.ts';

// What the server says of itself over both protocols: GET /v2 and gRPC ServerMetadata.

export const SERVER_NAME = 'conduit';

/** Triton's extensions that Conduit implements (not cuda_shared_memory: see cuda-shared-memory.ts). */
export const EXTENSIONS = [
  'model_repository', 'model_repository(unload_dependents)', 'schedule_policy', 'model_configuration', 'system_shared_memory',
  'binary_tensor_data', 'classification', 'sequence', 'parameters', 'statistics', 'trace', 'logging', 'generate',
];

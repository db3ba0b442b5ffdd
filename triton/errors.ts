// The errors of ordinary-model serving, by Triton's status codes (TRITONSERVER_Error_Code); the
// gateway renders each through its error catalogue (HTTP status, KServe body, gRPC status).

export type ClassicStatus = 'INVALID_ARG' | 'NOT_FOUND' | 'ALREADY_EXISTS' | 'UNAVAILABLE' | 'UNSUPPORTED' | 'INTERNAL';

export class ClassicError extends Error {
  override name = 'ClassicError';
  constructor(readonly status: ClassicStatus, message: string) {
    super(message);
  }
}

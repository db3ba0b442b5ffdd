// Keys and limits on the KServe gRPC service, the same as on HTTP (gateway/auth.ts,
// admission.ts): the key comes as `authorization: Bearer <key>` metadata (Triton's clients send
// their headers as metadata), a missing or unknown one is UNAUTHENTICATED; the administrative RPCs
// need an admin key (PERMISSION_DENIED otherwise); every call, and every request message of a
// stream, is a request against its key's limits (RESOURCE_EXHAUSTED over them), sharing the
// quota the key has on HTTP.
import type * as grpc from '@grpc/grpc-js';
import { type AccessControl, estimateTokens } from '../admission.ts';
import { adminRefusal, bearerKeyOf, type ApiKeySpec } from '../auth.ts';
import { ApiError } from '../errors.ts';
import type { UsageAccount } from '../generation.ts';
import { Admission } from '../rate-limits.ts';
import {
  CUDA_SHARED_MEMORY_SURFACE, LOGGING_SURFACE, REPOSITORY_SURFACE, SHARED_MEMORY_SURFACE, TRACE_SURFACE,
} from './control.ts';

/** The RPCs of the administrative surfaces, each with the surface it belongs to. */
const ADMIN_RPCS: Readonly<Record<string, string>> = {
  RepositoryModelLoad: REPOSITORY_SURFACE,
  RepositoryModelUnload: REPOSITORY_SURFACE,
  SystemSharedMemoryStatus: SHARED_MEMORY_SURFACE,
  SystemSharedMemoryRegister: SHARED_MEMORY_SURFACE,
  SystemSharedMemoryUnregister: SHARED_MEMORY_SURFACE,
  CudaSharedMemoryStatus: CUDA_SHARED_MEMORY_SURFACE,
  CudaSharedMemoryRegister: CUDA_SHARED_MEMORY_SURFACE,
  CudaSharedMemoryUnregister: CUDA_SHARED_MEMORY_SURFACE,
  TraceSetting: TRACE_SURFACE,
  LogSettings: LOGGING_SURFACE,
};

/**
 * The caller of a call, authenticated from its metadata as HTTP authenticates a request; throws
 * the catalogue's invalid_api_key (UNAUTHENTICATED). Two authorization values trust neither.
 */
export function callerOf(access: AccessControl, metadata: grpc.Metadata): ApiKeySpec | null {
  const values = metadata.get('authorization');
  const presentedKey = values.length === 1 && typeof values[0] === 'string' ? bearerKeyOf(values[0]) : null;
  const apiKey = access.ring.authenticate(presentedKey);
  if (apiKey instanceof ApiError) throw apiKey;
  return apiKey;
}

/** Throws permission_denied when the RPC is administrative and the caller's key is not admin. */
export function checkRpcRole(rpc: string, apiKey: ApiKeySpec | null): void {
  const surface = ADMIN_RPCS[rpc];
  if (surface === undefined) return;
  const refusal = adminRefusal(apiKey, surface);
  if (refusal !== null) throw refusal;
}

export interface GrpcAdmission {
  /** Charged with the tokens the call's generation uses, as an HTTP request's; undefined when nothing is limited. */
  account: UsageAccount | undefined;
  /** Frees its concurrency slot. */
  end(): void;
}

/**
 * Admits one request of the caller against its limits (its tokens estimated from the message's
 * size, as an HTTP body's); throws the 429's error (RESOURCE_EXHAUSTED).
 */
export function admitRequest(access: AccessControl, apiKey: ApiKeySpec | null, numMessageBytes: number): GrpcAdmission {
  const admission = access.admit(apiKey, estimateTokens(null, numMessageBytes));
  if (admission === null) return { account: undefined, end: () => {} };
  if (!(admission instanceof Admission)) throw admission.error;
  return { account: admission, end: () => admission.end() };
}

// Triton's CUDA shared-memory extension as a Triton built without GPU support answers it:
// Conduit's ordinary models run on CPU, so no CUDA IPC handle can be opened. Status lists no
// regions, registering is refused with UNSUPPORTED, and unregistering (nothing) succeeds; the
// server metadata does not claim `cuda_shared_memory`.
import { ClassicError } from '../../triton/index.ts';

/** Every registered CUDA region (none), or NOT_FOUND for a named one. */
export function cudaStatus(name: string | null): never[] {
  if (name !== null) throw new ClassicError('NOT_FOUND', `Unable to find cuda shared memory region: '${name}'`);
  return [];
}

export function cudaRegisterError(name: string): ClassicError {
  return new ClassicError('UNSUPPORTED', `failed to register CUDA shared memory region: '${name}', GPUs not supported (Conduit runs ordinary models on CPU; use system shared memory)`);
}

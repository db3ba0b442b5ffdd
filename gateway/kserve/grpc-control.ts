// The gRPC side of Triton's shared-memory, trace and logging extensions: the same state as the
// HTTP routes (KServeControl), in the messages of proto/grpc_service.proto.
import type { ModelRepository } from '../../triton/index.ts';
import type { KServeControl } from './control.ts';
import { cudaRegisterError, cudaStatus } from './cuda-shared-memory.ts';
import type { LogSettingsState } from './log-settings.ts';

type LogValue = { parameter_choice?: 'bool_param' | 'uint32_param' | 'string_param'; bool_param?: boolean; uint32_param?: number; string_param?: string };

const nameOrAll = (name: string) => (name === '' ? null : name);

function logSettingsMessage(state: LogSettingsState) {
  return {
    settings: {
      log_file: { string_param: state.log_file },
      log_info: { bool_param: state.log_info },
      log_warning: { bool_param: state.log_warning },
      log_error: { bool_param: state.log_error },
      log_verbose_level: { uint32_param: state.log_verbose_level },
      log_format: { string_param: state.log_format },
    },
  };
}

/** Handlers taking the request message and returning the response message (or throwing a ClassicError). */
export function controlHandlers(control: KServeControl, repository: ModelRepository) {
  const { sharedMemory, trace, logging } = control;
  const traceMessage = (model: string | null) => ({
    settings: Object.fromEntries(Object.entries(trace.settings(model)).map(([name, value]) => [name, { value: typeof value === 'string' ? [value] : value }])),
  });
  return {
    SystemSharedMemoryStatus: (request: { name: string }) => ({
      regions: Object.fromEntries(sharedMemory.status(nameOrAll(request.name)).map((region) => [region.name, region])),
    }),
    SystemSharedMemoryRegister: (request: { name: string; key: string; offset: string; byte_size: string }) => {
      sharedMemory.register(request.name, request.key, request.offset, request.byte_size);
      return {};
    },
    SystemSharedMemoryUnregister: (request: { name: string }) => {
      sharedMemory.unregister(nameOrAll(request.name));
      return {};
    },
    // No region is ever registered: every region is none, a named one NOT_FOUND.
    CudaSharedMemoryStatus: (request: { name: string }) => {
      cudaStatus(nameOrAll(request.name));
      return { regions: {} };
    },
    CudaSharedMemoryRegister: (request: { name: string }) => {
      throw cudaRegisterError(request.name);
    },
    // Nothing is ever registered, and unregistering an unknown region succeeds in Triton.
    CudaSharedMemoryUnregister: () => ({}),
    TraceSetting: (request: { settings: Record<string, { value: string[] }>; model_name: string }) => {
      const model = nameOrAll(request.model_name);
      if (model !== null) repository.get(model, null);
      const changes = Object.entries(request.settings);
      if (changes.length > 0) trace.update(model, Object.fromEntries(changes.map(([name, { value }]) => [name, value])));
      return traceMessage(model);
    },
    LogSettings: (request: { settings: Record<string, LogValue> }) => {
      const changes = Object.entries(request.settings).map(([name, value]) => [name, value.parameter_choice === undefined ? undefined : value[value.parameter_choice]]);
      return logSettingsMessage(changes.length === 0 ? logging.get() : logging.update(Object.fromEntries(changes)));
    },
  };
}

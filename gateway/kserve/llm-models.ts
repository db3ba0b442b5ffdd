// Every served LLM as a KServe v2 model, as Triton's vLLM and TensorRT-LLM backends present one:
// a decoupled model (max_batch_size 0) taking `text_input` (BYTES) and optional sampling inputs,
// answering `text_output` (BYTES). Infer answers once with the whole text; over gRPC's
// ModelStreamInfer with `stream: true` it answers once per text chunk, the last response flagged
// `triton_final_response`. The tensors are read into the generate extension's JSON, so both
// surfaces take the same fields with the same checks (generate.ts).
import {
  ClassicError, modelConfigSchema, StatsRecorder, type ModelConfig, type ModelIndexEntry, type ModelStatistics, type Tensor, type TensorMap,
} from '../../triton/index.ts';
import { startGeneration, type GenerationFinish } from '../generation.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { LoadedModel, ModelRegistry } from '../served-model.ts';
import { prepareGenerate } from './generate.ts';
import { isLlmReady } from './readiness.ts';

declare module 'fastify' {
  interface FastifyInstance {
    /** The gateway's LLMs as v2 models, for the gRPC service beside it. */
    kserveLlms: KServeLlms;
  }
}

/** The inputs as the vLLM backend and TensorRT-LLM's ensemble declare them; all but text_input optional. */
const INPUTS = [
  { name: 'text_input', data_type: 'TYPE_STRING', dims: [1] },
  { name: 'stream', data_type: 'TYPE_BOOL', dims: [1], optional: true },
  { name: 'exclude_input_in_output', data_type: 'TYPE_BOOL', dims: [1], optional: true },
  { name: 'max_tokens', data_type: 'TYPE_INT32', dims: [1], optional: true },
  { name: 'temperature', data_type: 'TYPE_FP32', dims: [1], optional: true },
  { name: 'top_p', data_type: 'TYPE_FP32', dims: [1], optional: true },
  { name: 'top_k', data_type: 'TYPE_INT32', dims: [1], optional: true },
  { name: 'seed', data_type: 'TYPE_UINT64', dims: [1], optional: true },
  { name: 'ignore_eos', data_type: 'TYPE_BOOL', dims: [1], optional: true },
  { name: 'stop', data_type: 'TYPE_STRING', dims: [-1], optional: true },
] as const;

const OUTPUTS = [
  { name: 'text_output', data_type: 'TYPE_STRING', dims: [-1] },
  { name: 'finish_reason', data_type: 'TYPE_STRING', dims: [-1] },
] as const;

/** What the config says runs the model: the engine workers, not a repository backend. */
export const LLM_BACKEND = 'conduit_llm';

const DATATYPES: Readonly<Record<string, string>> = { TYPE_STRING: 'BYTES', TYPE_BOOL: 'BOOL', TYPE_INT32: 'INT32', TYPE_FP32: 'FP32', TYPE_UINT64: 'UINT64' };
const utf8 = new TextDecoder('utf-8', { fatal: true });
const encoder = new TextEncoder();

function bytesTensor(text: string): Tensor {
  return { datatype: 'BYTES', shape: [1], data: [encoder.encode(text)] };
}

/** A BYTES element as text; invalid UTF-8 is the client's error. */
function textOf(element: Uint8Array, name: string): string {
  try {
    return utf8.decode(element);
  } catch {
    throw new ClassicError('INVALID_ARG', `input '${name}' is not valid UTF-8`);
  }
}

/** One input tensor as the generate extension's JSON value. */
function fieldOf(name: string, tensor: Tensor): unknown {
  const declared = INPUTS.find((input) => input.name === name);
  if (declared === undefined) throw new ClassicError('INVALID_ARG', `unexpected inference input '${name}', allowed inputs are: ${INPUTS.map((i) => i.name).join(', ')}`);
  const expected = DATATYPES[declared.data_type];
  if (tensor.datatype !== expected) throw new ClassicError('INVALID_ARG', `inference input '${name}' data-type is '${tensor.datatype}', but model expects '${expected}'`);
  const values = Array.from(tensor.data as ArrayLike<unknown>);
  if (name === 'stop') return values.map((value) => textOf(value as Uint8Array, name));
  if (values.length !== 1) throw new ClassicError('INVALID_ARG', `inference input '${name}' must hold one element, it holds ${values.length}`);
  const [value] = values;
  if (tensor.datatype === 'BYTES') return textOf(value as Uint8Array, name);
  if (tensor.datatype === 'BOOL') return value !== 0;
  if (tensor.datatype === 'UINT64') return Number(value as bigint);
  return value;
}

/** A request's inputs and parameters: the parameters first, the tensors over them (vLLM's backend reads both). */
function requestJson(inputs: TensorMap, parameters: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const json: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(parameters)) {
    if (INPUTS.some((input) => input.name === key && input.name !== 'text_input')) json[key] = value;
  }
  for (const [name, tensor] of Object.entries(inputs)) json[name] = fieldOf(name, tensor);
  if (json.text_input === undefined) throw new ClassicError('INVALID_ARG', "expected 1 inputs but got 0 inputs for model: missing 'text_input'");
  return json;
}

export interface LlmInferRequest {
  id: string;
  inputs: TensorMap;
  /** Request parameters (the generate extension's fields may come here too). */
  parameters: Readonly<Record<string, unknown>>;
  /** The outputs asked for; empty: all. */
  requestedOutputs: readonly string[];
}

export interface LlmInferHandlers {
  /** Each chunk of text as its own response (decoupled streaming); only when the request says `stream`. */
  onChunk?(outputs: TensorMap): void;
}

/** The LLMs of the registry, as v2 models: their configs, metadata, infer and statistics. */
export class KServeLlms {
  private readonly statsByName = new Map<string, StatsRecorder>();
  private readonly configsByName = new Map<string, ModelConfig>();

  constructor(private readonly registry: ModelRegistry, private readonly metrics: GatewayMetrics) {
    for (const model of registry.models) {
      this.statsByName.set(model.name, new StatsRecorder(model.name, 1));
      const parsed = modelConfigSchema.parse({ name: model.name, backend: 'script', max_batch_size: 0, input: INPUTS, output: OUTPUTS });
      // Shown, never loaded: the engine workers run it, not one of the repository's backends.
      this.configsByName.set(model.name, { ...parsed, name: model.name, backend: LLM_BACKEND as ModelConfig['backend'] });
    }
  }

  /** The LLM of that name and version (an LLM has version 1 only; null or '' means it); null when the name is not an LLM. */
  find(name: string, version: number | null = null): LoadedModel | null {
    const model = this.registry.models.find((m) => m.name === name) ?? null;
    if (model === null) return null;
    if (version !== null && version !== 1) throw new ClassicError('NOT_FOUND', `Request for unknown model: '${name}' version ${version} is not found`);
    return model;
  }

  config(model: LoadedModel): ModelConfig {
    return this.configsByName.get(model.name)!;
  }

  /** The config as /config and ModelConfig answer it, decoupled. */
  configJson(model: LoadedModel) {
    return { ...this.config(model), platform: '', model_transaction_policy: { decoupled: true } };
  }

  metadata(model: LoadedModel) {
    const config = this.config(model);
    const tensors = (list: ModelConfig['input'] | ModelConfig['output']) => list.map((t) => ({ name: t.name, datatype: DATATYPES[t.data_type], shape: t.dims }));
    return { name: model.name, versions: ['1'], platform: LLM_BACKEND, inputs: tensors(config.input), outputs: tensors(config.output) };
  }

  stats(name: string | null): ModelStatistics[] {
    return [...this.statsByName.values()].filter((s) => name === null || s.stats.name === name).map((s) => s.stats);
  }

  /** Repository index rows: each LLM's one version, READY while a worker serves it. */
  index(readyOnly: boolean): ModelIndexEntry[] {
    return this.registry.models
      .map((model) => isLlmReady(model)
        ? { name: model.name, version: '1', state: 'READY', reason: '' }
        : { name: model.name, version: '1', state: 'UNAVAILABLE', reason: 'no engine worker serves it yet' })
      .filter((entry) => !readyOnly || entry.state === 'READY') as ModelIndexEntry[];
  }

  /** Whether the request asks for streaming (the `stream` input or parameter). */
  isStreamed(request: LlmInferRequest): boolean {
    return requestJson(request.inputs, request.parameters).stream === true;
  }

  /**
   * Runs one request to its end: the whole text (with the prompt unless exclude_input_in_output),
   * or with `stream` each chunk through onChunk and the final outputs empty. `abort` is set so the
   * caller can cancel it when its client leaves.
   */
  async infer(model: LoadedModel, request: LlmInferRequest, handlers: LlmInferHandlers, signal: AbortSignal): Promise<TensorMap> {
    const startNs = process.hrtime.bigint();
    const stats = this.statsByName.get(model.name)!;
    const json = requestJson(request.inputs, request.parameters);
    const streamed = json.stream === true;
    if (streamed && handlers.onChunk === undefined) {
      throw new ClassicError('UNSUPPORTED', `model '${model.name}' is decoupled: a streamed request needs gRPC ModelStreamInfer or generate_stream`);
    }
    for (const name of request.requestedOutputs) {
      if (!OUTPUTS.some((output) => output.name === name)) throw new ClassicError('INVALID_ARG', `unexpected inference output '${name}' for model '${model.name}'`);
    }
    const wanted = (name: string) => request.requestedOutputs.length === 0 || request.requestedOutputs.includes(name);
    const outputsOf = (text: string, finishReason: string): TensorMap => {
      const outputs: TensorMap = {};
      if (wanted('text_output')) outputs.text_output = bytesTensor(text);
      if (wanted('finish_reason')) outputs.finish_reason = bytesTensor(finishReason);
      return outputs;
    };
    try {
      const { generationRequest, echoedPrompt } = prepareGenerate(model, { ...json, stream: undefined, id: request.id }, streamed, performance.now());
      let text = '';
      const finish = await new Promise<GenerationFinish>((resolve, reject) => {
        const generation = startGeneration(generationRequest, {
          onText: (delta) => {
            if (streamed) handlers.onChunk!(outputsOf(delta, ''));
            else text += delta;
          },
          onFinish: resolve,
          onError: reject,
        }, this.metrics);
        if (signal.aborted) generation.abort();
        else signal.addEventListener('abort', () => generation.abort(), { once: true });
      });
      const elapsedNs = Number(process.hrtime.bigint() - startNs);
      stats.recordSuccess(elapsedNs, 0, 0, elapsedNs, 0);
      stats.recordExecution(1, 0, elapsedNs, 0);
      return outputsOf(streamed ? '' : echoedPrompt + text, finish.finishReason ?? '');
    } catch (err) {
      stats.recordFailure(Number(process.hrtime.bigint() - startNs), signal.aborted ? 'CANCELED' : 'BACKEND');
      throw err;
    }
  }
}

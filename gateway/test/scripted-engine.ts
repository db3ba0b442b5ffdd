// A test double for an engine worker: it answers each request with token ids from a script,
// one step per event-loop turn, and records what it was asked and what was aborted.
import { EventEmitter } from 'node:events';
import type { EngineError } from '../../engine/errors.ts';
import type { EngineClient, GenerateRequest, RequestOutput, StepReport, WorkerLoad, WorkerModelInfo } from '../../engine/types.ts';
import type { RoutedWorker } from '../../router/least-loaded.ts';

export interface Script {
  /** Token ids per engine step. */
  steps: number[][];
  finishReason?: 'stop' | 'length';
  /** Fail after the steps instead of finishing. */
  error?: EngineError;
  /** Never finish after the steps: only an abort ends the request. */
  hang?: boolean;
}

export class ScriptedEngine extends EventEmitter implements EngineClient, RoutedWorker {
  readonly address = 'scripted:0';
  numInFlight = 0;
  serving = true;
  readonly requests: GenerateRequest[] = [];
  readonly abortedRequestIds: string[] = [];
  private readonly liveRequestIds = new Set<string>();
  private readonly scriptFor: (request: GenerateRequest) => Script;
  private readonly modelInfo: WorkerModelInfo;

  constructor(modelInfo: WorkerModelInfo, scriptFor: (request: GenerateRequest) => Script) {
    super();
    this.modelInfo = modelInfo;
    this.scriptFor = scriptFor;
  }

  generate(request: GenerateRequest, onOutput: (output: RequestOutput) => void): void {
    this.requests.push(request);
    this.liveRequestIds.add(request.requestId);
    this.numInFlight++;
    this.emit('generate', request);
    const script = this.scriptFor(request);
    const numPromptTokens = request.promptTokenIds.length;
    let numOutputTokens = 0;
    let stepIndex = 0;
    const step = () => {
      if (!this.liveRequestIds.has(request.requestId)) return;
      const newTokenIds = script.steps[stepIndex++] ?? [];
      // Output token k (from 1) has log-probability -k/4: exact in binary, distinct per token.
      const newLogprobs = newTokenIds.map((_, i) => -(numOutputTokens + i + 1) / 4);
      numOutputTokens += newTokenIds.length;
      const isLastStep = stepIndex >= script.steps.length;
      if (isLastStep && script.hang) {
        if (newTokenIds.length > 0) {
          onOutput({ requestId: request.requestId, newTokenIds, newLogprobs, finishReason: null, numPromptTokens, numCachedTokens: 0, numOutputTokens });
        }
        return;
      }
      const finishReason = !isLastStep ? null : script.error ? 'error' : (script.finishReason ?? 'length');
      if (finishReason !== null) this.end(request.requestId);
      onOutput({
        requestId: request.requestId,
        newTokenIds,
        newLogprobs,
        finishReason,
        numPromptTokens,
        numCachedTokens: 0,
        numOutputTokens,
        ...(finishReason === 'error' ? { error: script.error } : {}),
      });
      if (finishReason === null) setImmediate(step);
    };
    setImmediate(step);
  }

  abort(requestId: string): void {
    if (!this.liveRequestIds.has(requestId)) return;
    this.end(requestId);
    this.abortedRequestIds.push(requestId);
    this.emit('abort', requestId);
  }

  get load(): WorkerLoad {
    return { numRunning: this.numInFlight, numWaiting: 0, numFreeBlocks: 90, numTotalBlocks: 100, numQueuedPrefillTokens: 0 };
  }

  onReport(_listener: (report: StepReport) => void): () => void {
    return () => {};
  }

  async health() {
    return { serving: this.serving, model: this.modelInfo, load: this.load };
  }

  close(): void {}

  private end(requestId: string) {
    this.liveRequestIds.delete(requestId);
    this.numInFlight--;
  }
}

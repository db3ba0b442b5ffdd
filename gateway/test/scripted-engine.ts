// A test double for an engine worker: it answers each request with token ids from a script,
// one step per event-loop turn, and records what it was asked and what was aborted.
import { EventEmitter } from 'node:events';
import type { EngineError } from '../../engine/errors.ts';
import type {
  EngineClient, GenerateRequest, PromptTokenLogprobs, RequestOutput, StepReport, WorkerLoad, WorkerModelInfo,
} from '../../engine/types.ts';

export interface Script {
  /** Token ids per engine step. */
  steps: number[][];
  finishReason?: 'stop' | 'length';
  /** Fail after the steps instead of finishing. */
  error?: EngineError;
  /** Never finish after the steps: only an abort ends the request. */
  hang?: boolean;
  /** Prompt tokens the worker claims it found in its prefix cache. */
  numCachedTokens?: number;
  /** With finishReason 'stop': the stop token that ended it (the script's last token), as a worker reports it. */
  stopTokenId?: number;
  /** Milliseconds before the first step (a long prefill); the first step comes on the next turn otherwise. */
  firstStepDelayMs?: number;
  /** Milliseconds between steps; one step per event-loop turn otherwise. */
  stepIntervalMs?: number;
  /** The worker's queue and prefill times, reported with the first token as a worker does; none when unset. */
  queueTimeMs?: number;
  prefillTimeMs?: number;
}

/**
 * Alternatives a test can predict: the k-th likeliest (from 0) is tokenId + k with
 * log-probability logprob - k, so the token itself ranks first.
 */
function scriptedAlternatives(tokenId: number, logprob: number, numAlternatives: number): PromptTokenLogprobs {
  const ranks = Array.from({ length: numAlternatives }, (_, k) => k);
  return { logprob, rank: 1, topTokenIds: ranks.map((k) => tokenId + k), topLogprobs: ranks.map((k) => logprob - k) };
}

function after(delayMs: number | undefined, run: () => void) {
  if (delayMs === undefined) setImmediate(run);
  else setTimeout(run, delayMs);
}

export class ScriptedEngine extends EventEmitter implements EngineClient {
  readonly address: string;
  /** Requests from generate until their last output or abort. */
  numInFlight = 0;
  serving = true;
  readonly requests: GenerateRequest[] = [];
  readonly abortedRequestIds: string[] = [];
  private readonly liveRequestIds = new Set<string>();
  /** How to end each request left hanging (finishHanging). */
  private readonly hangingFinishers = new Map<string, () => void>();
  private readonly reportListeners = new Set<(report: StepReport) => void>();
  private readonly scriptFor: (request: GenerateRequest) => Script;
  private readonly modelInfo: WorkerModelInfo;

  constructor(modelInfo: WorkerModelInfo, scriptFor: (request: GenerateRequest) => Script, address = 'scripted:0') {
    super();
    this.address = address;
    this.modelInfo = modelInfo;
    this.scriptFor = scriptFor;
  }

  generate(request: GenerateRequest, onOutput: (output: RequestOutput) => void): void {
    this.requests.push(request);
    this.liveRequestIds.add(request.requestId);
    this.numInFlight++;
    this.emit('generate', request);
    const script = this.scriptFor(request);
    const { promptTokenIds, sampling } = request;
    const numPromptTokens = promptTokenIds.length;
    const numCachedTokens = script.numCachedTokens ?? 0;
    const numTopLogprobs = sampling.numTopLogprobs ?? 0;
    let numOutputTokens = 0;
    let stepIndex = 0;
    const step = () => {
      if (!this.liveRequestIds.has(request.requestId)) return;
      const isFirstStep = stepIndex === 0;
      const newTokenIds = script.steps[stepIndex++] ?? [];
      // Output token k (from 1) has log-probability -k/4: exact in binary, distinct per token.
      const newLogprobs = newTokenIds.map((_, i) => -(numOutputTokens + i + 1) / 4);
      numOutputTokens += newTokenIds.length;
      const news = { requestId: request.requestId, newTokenIds, newLogprobs, numPromptTokens, numCachedTokens, numOutputTokens };
      const output: Omit<RequestOutput, 'finishReason'> = numTopLogprobs === 0
        ? news
        : { ...news, newTopLogprobs: newTokenIds.map((id, i) => scriptedAlternatives(id, newLogprobs[i], numTopLogprobs)) };
      if (numOutputTokens === newTokenIds.length && newTokenIds.length > 0 && script.queueTimeMs !== undefined) {
        output.queueTimeMs = script.queueTimeMs;
        output.prefillTimeMs = script.prefillTimeMs ?? 0;
      }
      if (isFirstStep && sampling.numPromptLogprobs !== undefined) {
        // Prompt token i (from 1) has log-probability -i/8.
        output.promptLogprobs = promptTokenIds
          .slice(1)
          .map((id, i) => scriptedAlternatives(id, -(i + 1) / 8, sampling.numPromptLogprobs!));
      }
      const isLastStep = stepIndex >= script.steps.length;
      if (isLastStep && script.hang) {
        if (newTokenIds.length > 0) onOutput({ ...output, finishReason: null });
        this.hangingFinishers.set(request.requestId, () => {
          this.end(request.requestId);
          onOutput({ ...news, newTokenIds: [], newLogprobs: [], finishReason: 'stop' });
        });
        return;
      }
      const finishReason = !isLastStep ? null : script.error ? 'error' : (script.finishReason ?? 'length');
      if (finishReason !== null) this.end(request.requestId);
      const ending = finishReason === 'error' ? { error: script.error } : finishReason === 'stop' && script.stopTokenId !== undefined ? { stopTokenId: script.stopTokenId } : {};
      onOutput({ ...output, finishReason, ...ending });
      if (finishReason === null) after(script.stepIntervalMs, step);
    };
    after(script.firstStepDelayMs, step);
  }

  /** Ends a request its script left hanging, as if it had stopped now. */
  finishHanging(requestId: string): void {
    if (!this.liveRequestIds.has(requestId)) return;
    this.hangingFinishers.get(requestId)!();
  }

  abort(requestId: string): void {
    if (!this.liveRequestIds.has(requestId)) return;
    this.end(requestId);
    this.abortedRequestIds.push(requestId);
    this.emit('abort', requestId);
  }

  /** Set to act as a worker whose stream is down: no load to report (what GrpcEngineClient reports then). */
  isStreamDown = false;

  get load(): WorkerLoad | null {
    return this.isStreamDown ? null : this.currentLoad();
  }

  private currentLoad(): WorkerLoad {
    return { numRunning: this.numInFlight, numWaiting: 0, numFreeBlocks: 90, numTotalBlocks: 100, numQueuedPrefillTokens: 0, numCachedBlocks: 0 };
  }

  onReport(listener: (report: StepReport) => void): () => void {
    this.reportListeners.add(listener);
    return () => this.reportListeners.delete(listener);
  }

  /** Pushes a step report to every listener, as a worker does after each step. */
  report(stats: StepReport['stats']) {
    for (const listener of this.reportListeners) listener({ events: [], load: this.currentLoad(), stats });
  }

  /** Set to act as a stopped worker (SIGSTOP): health() never answers. */
  isHealthHung = false;

  async health() {
    if (this.isHealthHung) await new Promise<never>(() => {});
    return { serving: this.serving, model: this.modelInfo, load: this.currentLoad() };
  }

  close(): void {}

  private end(requestId: string) {
    this.liveRequestIds.delete(requestId);
    this.hangingFinishers.delete(requestId);
    this.numInFlight--;
  }
}

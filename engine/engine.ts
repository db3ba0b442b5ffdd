// The engine loop: the one owner of scheduler and KV state. Callers post commands (generate,
// abort) to an inbox; between steps the loop applies them, then runs
// schedule() -> runner.execute() -> update() and hands each request its news. With nothing to
// do it sleeps until the next command arrives.
import type { GenerationDefaults } from './generation-config.ts';
import type { ModelRunner } from './runner.ts';
import { errorOutput } from './request-output.ts';
import { Scheduler } from './scheduler.ts';
import type { EngineError, GenerateRequest, RequestOutput, WorkerLoad, WorkerModelInfo } from './types.ts';

export interface EngineSettings {
  servedName: string;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  generationDefaults: GenerationDefaults;
}

export type OutputListener = (output: RequestOutput) => void;

type Command =
  | { kind: 'generate'; request: GenerateRequest; onOutput: OutputListener }
  | { kind: 'abort'; requestId: string };

export interface EngineHealth {
  serving: boolean;
  model: WorkerModelInfo;
  load: WorkerLoad;
}

export class Engine {
  readonly model: WorkerModelInfo;
  private readonly runner: ModelRunner;
  private readonly scheduler: Scheduler;
  private readonly listeners = new Map<string, OutputListener>();
  private inbox: Command[] = [];
  private wake: (() => void) | null = null;
  private stopError: EngineError | null = null;
  private readonly loopDone: Promise<void>;
  private closing: Promise<void> | null = null;

  constructor(runner: ModelRunner, settings: EngineSettings) {
    const { numKvBlocks, blockSizeTokens, maxModelLen, vocabSize } = runner.info;
    this.runner = runner;
    this.scheduler = new Scheduler({
      numKvBlocks,
      blockSizeTokens,
      maxModelLen,
      vocabSize,
      maxNumSeqs: settings.maxNumSeqs,
      maxNumBatchedTokens: settings.maxNumBatchedTokens,
      generationDefaults: settings.generationDefaults,
    });
    this.model = {
      modelName: settings.servedName,
      maxModelLen,
      vocabSize,
      blockSizeTokens,
      eosTokenIds: settings.generationDefaults.eosTokenIds.slice(),
    };
    this.loopDone = this.run();
  }

  /** Streams one request's outputs to onOutput; the last one has a finishReason. */
  generate(request: GenerateRequest, onOutput: OutputListener): void {
    const stopError = this.stopError;
    if (stopError === null) this.post({ kind: 'generate', request, onOutput });
    // The loop may have exited already; answer the way it would, and never synchronously.
    else queueMicrotask(() => onOutput(errorOutput(request.requestId, request.promptTokenIds.length, stopError)));
  }

  /** Ends the request with finishReason 'abort' and frees its blocks once the current step ends. */
  abort(requestId: string): void {
    this.post({ kind: 'abort', requestId });
  }

  health(): EngineHealth {
    const load = this.scheduler.load();
    // Requests posted during a step are waiting too, just not in the scheduler's queue yet.
    for (const command of this.inbox) if (command.kind === 'generate') load.numWaiting++;
    return { serving: this.stopError === null, model: this.model, load };
  }

  /** Ends every request in flight with an error, stops the loop, and closes the runner. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.stopError ??= { code: 'engine_unavailable', message: 'The engine worker is shutting down' };
      this.notify();
      await this.loopDone;
      this.runner.close();
    })();
    return this.closing;
  }

  private post(command: Command): void {
    this.inbox.push(command);
    this.notify();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }

  private async run(): Promise<void> {
    try {
      while (this.stopError === null) {
        this.applyInbox();
        if (!this.scheduler.hasUnfinished) {
          await new Promise<void>((resolve) => (this.wake = resolve));
          continue;
        }
        await this.step();
        // A runner that resolves at once would otherwise starve the event loop's I/O.
        await new Promise((resolve) => setImmediate(resolve));
      }
    } catch (err) {
      this.stopError = { code: 'internal_error', message: `The engine loop stopped: ${(err as Error).message}` };
    }
    this.applyInbox();
    for (const [requestId, onOutput] of this.listeners) onOutput(errorOutput(requestId, 0, this.stopError!));
    this.listeners.clear();
  }

  private applyInbox(): void {
    const commands = this.inbox;
    this.inbox = [];
    for (const command of commands) {
      if (command.kind === 'abort') {
        const output = this.scheduler.abort(command.requestId);
        if (output !== null) this.emit(output);
        continue;
      }
      const { request, onOutput } = command;
      const refusal = this.stopError ?? this.scheduler.add(request);
      if (refusal === null) this.listeners.set(request.requestId, onOutput);
      else onOutput(errorOutput(request.requestId, request.promptTokenIds.length, refusal));
    }
  }

  private async step(): Promise<void> {
    const output = this.scheduler.schedule();
    let outputs: RequestOutput[];
    try {
      const result = await this.runner.execute(output);
      outputs = this.scheduler.update(output, result);
    } catch (err) {
      outputs = this.scheduler.failStep(output, { code: 'internal_error', message: (err as Error).message });
    }
    for (const news of outputs) this.emit(news);
  }

  private emit(output: RequestOutput): void {
    const { requestId } = output;
    const onOutput = this.listeners.get(requestId)!;
    if (output.finishReason !== null) this.listeners.delete(requestId);
    try {
      onOutput(output);
    } catch (err) {
      // A listener's bug costs its own request, not the loop that every other request needs.
      process.emitWarning(`output listener of request ${requestId} threw: ${(err as Error).message}`);
      if (output.finishReason !== null) return;
      this.listeners.delete(requestId);
      this.scheduler.abort(requestId);
    }
  }
}

export function createEngine(runner: ModelRunner, settings: EngineSettings): Engine {
  return new Engine(runner, settings);
}

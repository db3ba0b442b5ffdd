// The engine loop: the one owner of scheduler and KV state. Callers post commands (generate,
// abort) to an inbox; between steps the loop applies them, ends requests past their deadlines,
// then runs schedule() -> runner.execute() -> update() and hands each request its news. After
// each round it reports once to every report listener: the prefix cache's events, the load and
// the step's statistics (a listener batches its requests' news with it: one message per step).
// With nothing to do it sleeps until the next command arrives.
import { availableCores } from './compute-threads.ts';
import type { EngineError } from './errors.ts';
import type { GenerationDefaults } from './generation-config.ts';
import { prepareStructuredOutput, type GrammarService } from './grammar/service.ts';
import { HASH_SCHEME } from './kv/block-hash.ts';
import { silentLogger, type Logger } from './log.ts';
import type { ModelRunner } from './runner.ts';
import type { RunnerResult, ScheduledSequence } from './scheduler-output.ts';
import { errorOutput } from './request-output.ts';
import { Scheduler, prefillLimitsFor, type PrefillLimits, type SchedulingPolicy } from './scheduler.ts';
import type { Proposer, SpeculativeConfig } from './spec/proposer.ts';
import { Speculator } from './spec/speculator.ts';
import type { GenerateRequest, ReportListener, RequestOutput, StepReport, StepStats, WorkerLoad, WorkerModelInfo } from './types.ts';

export interface EngineSettings {
  servedName: string;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  generationDefaults: GenerationDefaults;
  /** On by default. */
  enablePrefixCaching?: boolean;
  /** 'fcfs' by default. */
  policy?: SchedulingPolicy;
  /**
   * How prompts share a step (scheduler.ts); by default the interactivity mode's: one long
   * prompt a step (more than maxNumBatchedTokens / 8 tokens to compute), short ones beside it.
   */
  prefillLimits?: PrefillLimits;
  /** Structured outputs' grammars (engine/grammar/); without it such requests are refused. */
  grammars?: GrammarService;
  /** Speculative decoding (spec/): the model's speculative_config; none when absent or null. */
  speculative?: SpeculativeConfig | null;
  /** The proposer to use instead of the config's method (a proposer of one's own; tests). */
  proposer?: Proposer;
  /** The worker's log (log.ts); silent when omitted (tests, tools). */
  log?: Logger;
  /**
   * The cores this process may use (by default its CPU affinity's): while grammars compile, a
   * step runs with at most the cores they leave (compute-threads.ts).
   */
  numCores?: number;
  /**
   * When a new grammar that forces a start, of a request that arrives alone, compiles over the
   * vocabulary after that start is output: for a prompt estimated short (the default;
   * DEFER_COMPILE_BELOW_COMPILES), for every prompt, or never (all from admission: a benchmark's
   * reference).
   */
  deferGrammarCompiles?: 'short-prompts' | 'always' | 'never';
}

/**
 * A new grammar's compile over the vocabulary waits for its forced start to be output (after the
 * prompt's pass) when that pass is estimated shorter than this many such compiles. Beside the
 * pass the compile costs it about half the compile's time: the pass leaves the compile's thread a
 * core (compute-threads.ts), so two compute threads on two cores run as one while it lasts. The
 * forced start, the first output, waits for that; deferred, the compile overlaps the pass that
 * computes the forced tokens instead. So a short prompt's first output comes sooner, and a long
 * prompt's pass, which hides the compile, keeps it beside. 5 is arithmetic, not a bench point:
 * defer while half a compile is more than a tenth of the pass (1/2 / 1/10 = 5 compiles). With more
 * compute threads a compile takes a smaller share of the pass (one thread of many), so there this
 * defers more prompts than the tenth asks; that is unmeasured.
 */
const DEFER_COMPILE_BELOW_COMPILES = 5;

/** Prefill passes of at least this many tokens estimate a prompt's pass (ms per token). */
const MIN_ESTIMATING_PASS_TOKENS = 16;

/** How long the loop naps when every request in flight waits on its grammar. */
const GRAMMAR_WAIT_MS = 20;

const RSS_SAMPLE_INTERVAL_MS = 1000;

export type OutputListener = (output: RequestOutput) => void;

type Command =
  | { kind: 'generate'; request: GenerateRequest; onOutput: OutputListener; receivedMs: number }
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
  private readonly grammars: GrammarService | null;
  private readonly speculator: Speculator | null;
  private readonly log: Logger;
  private readonly eosTokenIds: readonly number[];
  private readonly numCores: number;
  private readonly deferGrammarCompiles: 'short-prompts' | 'always' | 'never';
  private readonly listeners = new Map<string, OutputListener>();
  private readonly reportListeners = new Set<ReportListener>();
  private inbox: Command[] = [];
  private wake: (() => void) | null = null;
  private stopError: EngineError | null = null;
  /** Outputs emitted since the last report: a report must follow them. */
  private numUnreportedOutputs = 0;
  private readonly loopDone: Promise<void>;
  private closing: Promise<void> | null = null;
  private residentMemoryBytes = 0;
  private residentMemoryReadAtMs = -Infinity;
  /** Recent lone prefill passes' milliseconds per token (a moving average); null before the first. */
  private prefillMsPerToken: number | null = null;

  constructor(runner: ModelRunner, settings: EngineSettings) {
    const { numKvBlocks, blockSizeTokens, kvCacheGroups, maxModelLen, vocabSize } = runner.info;
    this.runner = runner;
    this.speculator = settings.speculative == null ? null : new Speculator(settings.speculative, settings.proposer);
    this.log = settings.log ?? silentLogger;
    this.scheduler = new Scheduler({
      numKvBlocks,
      blockSizeTokens,
      kvCacheGroups,
      maxModelLen,
      vocabSize,
      maxNumSeqs: settings.maxNumSeqs,
      maxNumBatchedTokens: settings.maxNumBatchedTokens,
      ...(settings.prefillLimits ?? prefillLimitsFor('interactivity', settings.maxNumSeqs, settings.maxNumBatchedTokens)),
      generationDefaults: settings.generationDefaults,
      modelName: settings.servedName,
      enablePrefixCaching: settings.enablePrefixCaching ?? true,
      policy: settings.policy ?? 'fcfs',
      speculator: this.speculator,
    });
    this.grammars = settings.grammars ?? null;
    this.numCores = settings.numCores ?? availableCores();
    this.deferGrammarCompiles = settings.deferGrammarCompiles ?? 'short-prompts';
    this.eosTokenIds = settings.generationDefaults.eosTokenIds;
    if (this.grammars !== null) this.grammars.onChange = () => this.notify();
    const { numComputeThreads } = runner.info;
    if (this.grammars !== null && runner.activeThreadsCell !== undefined && numComputeThreads !== undefined) {
      this.grammars.shareComputeThreads(runner.activeThreadsCell, numComputeThreads, this.numCores);
    }
    this.model = {
      modelName: settings.servedName,
      maxModelLen,
      vocabSize,
      blockSizeTokens,
      eosTokenIds: settings.generationDefaults.eosTokenIds.slice(),
      blockHashScheme: HASH_SCHEME,
    };
    this.loopDone = this.run();
  }

  /** Streams one request's outputs to onOutput; the last one has a finishReason. */
  generate(request: GenerateRequest, onOutput: OutputListener): void {
    const stopError = this.stopError;
    // Its queue time counts from here: a request that arrives during a step waits for that step.
    if (stopError === null) this.post({ kind: 'generate', request, onOutput, receivedMs: performance.now() });
    // The loop may have exited already; answer the way it would, and never synchronously.
    else {
      queueMicrotask(() => {
        this.numUnreportedOutputs++;
        onOutput(errorOutput(request.requestId, request.promptTokenIds.length, stopError));
        this.report(null);
      });
    }
  }

  /** Ends the request with finishReason 'abort' and frees its blocks once the current step ends. */
  abort(requestId: string): void {
    this.post({ kind: 'abort', requestId });
  }

  /**
   * Calls listener after every round that did something, the first time with the whole prefix
   * cache (so the listener's view starts complete); returns the unsubscribe function.
   */
  onReport(listener: ReportListener): () => void {
    this.reportListeners.add(listener);
    queueMicrotask(() => {
      if (this.reportListeners.has(listener)) listener({ events: this.scheduler.kvSnapshot(), load: this.load(), stats: null });
    });
    return () => this.reportListeners.delete(listener);
  }

  health(): EngineHealth {
    return { serving: this.stopError === null, model: this.model, load: this.load() };
  }

  /** Ends every request in flight with an error, stops the loop, and closes the runner. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.stopError ??= { code: 'engine_unavailable', message: 'The engine worker is shutting down' };
      this.notify();
      await this.loopDone;
      await this.grammars?.shutdown();
      this.runner.close();
    })();
    return this.closing;
  }

  private load(): WorkerLoad {
    const load = this.scheduler.load();
    // Requests posted during a step are waiting too, just not in the scheduler's queue yet.
    for (const command of this.inbox) {
      if (command.kind !== 'generate') continue;
      load.numWaiting++;
      load.numQueuedPrefillTokens += command.request.promptTokenIds.length;
    }
    return load;
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
        for (const output of this.scheduler.expire()) this.emit(output);
        this.applyGrammars();
        let stats: StepStats | null = null;
        if (this.scheduler.hasUnfinished) stats = await this.step();
        this.report(stats);
        if (!this.scheduler.hasUnfinished && this.inbox.length === 0 && this.stopError === null) {
          await new Promise<void>((resolve) => (this.wake = resolve));
          continue;
        }
        if (stats === null && this.inbox.length === 0) {
          // Every request in flight waits for its grammar: wait for one to be ready (or a
          // command), napping so that deadlines are still checked.
          await new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, GRAMMAR_WAIT_MS);
            this.wake = () => {
              clearTimeout(timer);
              resolve();
            };
          });
          this.wake = null;
          continue;
        }
        // A runner that resolves at once would otherwise starve the event loop's I/O.
        await new Promise((resolve) => setImmediate(resolve));
      }
    } catch (err) {
      this.stopError = { code: 'internal_error', message: `The engine loop stopped: ${(err as Error).message}` };
    }
    this.applyInbox();
    for (const [requestId, onOutput] of this.listeners) onOutput(errorOutput(requestId, 0, this.stopError!));
    this.listeners.clear();
    this.report(null);
  }

  private applyInbox(): void {
    const commands = this.inbox;
    this.inbox = [];
    let numArriving = 0;
    for (const command of commands) if (command.kind === 'generate') numArriving++;
    for (const command of commands) {
      if (command.kind === 'abort') {
        const output = this.scheduler.abort(command.requestId);
        if (output !== null) this.emit(output);
        continue;
      }
      const { request, onOutput, receivedMs } = command;
      const refusal = this.stopError ?? this.admit(request, receivedMs, numArriving === 1);
      if (refusal === null) {
        this.listeners.set(request.requestId, onOutput);
      } else {
        this.numUnreportedOutputs++;
        onOutput(errorOutput(request.requestId, request.promptTokenIds.length, refusal));
      }
    }
  }

  /**
   * Queues a request with its grammar, which starts compiling as its prompt is computed (or after
   * its forced start: defersCompile()); arrivesAlone when no other request arrives with it.
   */
  private admit(request: GenerateRequest, receivedMs: number, arrivesAlone: boolean): EngineError | null {
    const structured = request.structuredOutput;
    if (structured === undefined) return this.scheduler.add(request, receivedMs);
    if (this.grammars === null) return { code: 'invalid_request', message: 'This worker serves no structured outputs' };
    const prepared = prepareStructuredOutput(structured, this.runner.info.vocabSize);
    if ('code' in prepared) return prepared;
    const stopTokenIds = [...new Set([...this.eosTokenIds, ...(request.sampling.stopTokenIds ?? [])])];
    const grammar = this.grammars.create(request.requestId, prepared, stopTokenIds);
    const isAlone = arrivesAlone && !this.scheduler.hasUnfinished;
    const refusal = this.scheduler.add(request, receivedMs, grammar);
    if (refusal === null) this.grammars.open(grammar, isAlone && this.defersCompile(request.promptTokenIds.length));
    return refusal;
  }

  /**
   * Whether a request's new grammar compiles after its forced start (deferGrammarCompiles); for
   * short prompts, those whose pass is estimated shorter than DEFER_COMPILE_BELOW_COMPILES
   * compiles (none until both have been measured). Only a request that arrives alone defers: its
   * pass that samples may then wait for the compile to end (Sequence.isAlone), where beside
   * others it would hold back a pass.
   */
  private defersCompile(numPromptTokens: number): boolean {
    if (this.deferGrammarCompiles !== 'short-prompts') return this.deferGrammarCompiles === 'always';
    const compileMs = this.grammars?.compileMsEstimate ?? null;
    if (compileMs === null || this.prefillMsPerToken === null) return false;
    return numPromptTokens * this.prefillMsPerToken < DEFER_COMPILE_BELOW_COMPILES * compileMs;
  }

  /**
   * Ends the requests whose grammars failed to compile or to follow their output, and outputs the
   * tokens new grammars force from their start (before they compile, before any prefill).
   */
  private applyGrammars(): void {
    if (this.grammars === null) return;
    for (const grammar of this.grammars.takeFailures()) {
      const output = this.scheduler.fail(grammar.requestId, grammar.failure!);
      if (output !== null) this.emit(output);
    }
    for (const { requestId, tokenIds, numOutputTokensBefore } of this.grammars.takeForcedStarts()) {
      const output = this.scheduler.forceOutput(requestId, tokenIds, numOutputTokensBefore);
      if (output !== null) this.emit(output);
    }
  }

  /** One step; null when nothing could be scheduled (every request waits for its grammar). */
  private async step(): Promise<StepStats | null> {
    const scheduleStart = performance.now();
    // A proposer that works ahead (a draft model) does so now; its time is the step's, for the cost model.
    if (this.speculator?.prepares) {
      try {
        await this.speculator.prepare(this.scheduler.speculationCandidates());
      } catch (err) {
        this.log.warn({ err }, 'the draft model failed: this step verifies no proposals');
      }
    }
    const output = this.scheduler.schedule();
    if (output.scheduled.length === 0) return null;
    const grammars = this.grammars;
    const bitmasks = grammars?.fillStep(output.scheduled) ?? null;
    if (bitmasks !== null && !grammars!.overlapForward) await grammars!.stepDone();
    const forwardStart = performance.now();
    let outputs: RequestOutput[];
    let forwardMs: number;
    try {
      const pass = this.runner.execute(output, bitmasks);
      // Both settle before the next step: the threads' rows, and what they found to force.
      const [result] = await Promise.all([pass, bitmasks === null ? null : grammars!.stepDone()]);
      forwardMs = performance.now() - forwardStart;
      if (output.scheduled.length === 1 && output.numScheduledTokens >= MIN_ESTIMATING_PASS_TOKENS) {
        const msPerToken = forwardMs / output.numScheduledTokens;
        this.prefillMsPerToken = this.prefillMsPerToken === null ? msPerToken : this.prefillMsPerToken + (msPerToken - this.prefillMsPerToken) / 4;
      }
      const forced = bitmasks === null ? null : grammars!.forcedTokens(output.scheduled, firstSamplesOf(result, output.scheduled.length));
      outputs = this.scheduler.update(output, result, forced, bitmasks === null ? undefined : grammars!.withheld);
    } catch (err) {
      if (bitmasks !== null) await grammars!.stepDone();
      forwardMs = performance.now() - forwardStart;
      // A tensor-parallel rank lost: no step can run any more, and the worker restarts with its group.
      const groupLost = (err as { code?: string }).code === 'CD_ERR_RANK_UNAVAILABLE';
      const error = { code: groupLost ? 'engine_unavailable' : 'internal_error', message: (err as Error).message } as const;
      if (groupLost) this.stopError = error;
      outputs = this.scheduler.failStep(output, error);
    }
    for (const news of outputs) this.emit(news);
    // The whole step's time: the loop's work per step is a fixed cost that each proposal accepted
    // saves too.
    if (this.speculator !== null && output.scheduled.every(isDecode)) this.speculator.observeStep(output.numScheduledTokens, performance.now() - scheduleStart);
    const counters = this.scheduler.takeCounters();
    return {
      numScheduledTokens: output.numScheduledTokens,
      numScheduledSeqs: output.scheduled.length,
      numPreempted: counters.numPreempted,
      scheduleMs: performance.now() - scheduleStart - forwardMs,
      forwardMs,
      numPrefixQueriedTokens: counters.numPrefixQueriedTokens,
      numPrefixHitTokens: counters.numPrefixHitTokens,
      ...(counters.specDecode === null ? {} : { specDecode: counters.specDecode }),
      kvUsage: this.scheduler.kvUsage,
      residentMemoryBytes: this.sampleResidentMemory(),
    };
  }

  /** Reading the RSS costs a read of /proc: once a second is plenty for a gauge. */
  private sampleResidentMemory(): number {
    const nowMs = performance.now();
    if (nowMs - this.residentMemoryReadAtMs >= RSS_SAMPLE_INTERVAL_MS) {
      this.residentMemoryBytes = process.memoryUsage.rss();
      this.residentMemoryReadAtMs = nowMs;
    }
    return this.residentMemoryBytes;
  }

  /** Tells every report listener what this round did, if it did anything worth telling. */
  private report(stats: StepStats | null): void {
    const events = this.scheduler.takeKvEvents();
    if (stats === null && events.length === 0 && this.numUnreportedOutputs === 0) return;
    this.numUnreportedOutputs = 0;
    const report: StepReport = { events, load: this.load(), stats };
    for (const listener of this.reportListeners) listener(report);
  }

  private emit(output: RequestOutput): void {
    const { requestId } = output;
    const onOutput = this.listeners.get(requestId)!;
    if (output.finishReason !== null) {
      this.listeners.delete(requestId);
      this.grammars?.close(requestId);
    }
    this.numUnreportedOutputs++;
    try {
      onOutput(output);
    } catch (err) {
      // A listener's bug costs its own request, not the loop that every other request needs.
      this.log.warn({ engine_request_id: requestId, err }, 'output listener threw; the request is aborted');
      if (output.finishReason !== null) return;
      this.listeners.delete(requestId);
      this.scheduler.abort(requestId);
      this.grammars?.close(requestId);
    }
  }
}

/** A decode's chunk: its last known token and its proposals (a prompt chunk costs differently per token). */
function isDecode(entry: ScheduledSequence): boolean {
  return entry.sample && entry.numScheduledTokens === 1 + entry.draftTokenIds.length;
}

/** Each sequence's first sample (a structured output's one: those never speculate). */
function firstSamplesOf(result: RunnerResult, numSeqs: number): Int32Array {
  const stride = result.sampleStride ?? 1;
  if (stride === 1) return result.sampledTokenIds;
  return Int32Array.from({ length: numSeqs }, (_, seq) => result.sampledTokenIds[seq * stride]);
}

export function createEngine(runner: ModelRunner, settings: EngineSettings): Engine {
  return new Engine(runner, settings);
}

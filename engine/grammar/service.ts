// The engine's side of structured outputs: grammar threads (thread.ts) that compile each
// request's grammar while its prompt is prefilled, keep its matcher, and fill its token bitmask
// every step it samples. The engine loop calls prepare() and open() at admission, fillStep()
// before each forward pass, forcedTokens() after it, close() when a request ends.
//
// Masks overlap the forward pass: fillStep() posts each thread the tokens its matchers have not
// seen and the rows to write, and returns at once; the pass runs its layers while the threads
// fill the rows of a SharedArrayBuffer and count them on a shared counter, which the native
// sampler waits on before it samples (native/README.md). A sequence stays on the thread that
// compiled its grammar (a compiled grammar cannot leave its WebAssembly instance); a new one goes
// to the thread that has its grammar cached, else to the least busy.
import { Worker } from 'node:worker_threads';
import { changeBusyJobs, numBusyGrammarThreads, type SharedComputeThreads } from '../compute-threads.ts';
import type { EngineError } from '../errors.ts';
import type { ScheduledSequence } from '../scheduler-output.ts';
import type { GrammarGate } from '../sequence.ts';
import type { StructuredOutput } from '../types.ts';
import { ForcedTokenizer } from './forced-tokens.ts';
import { prepareJsonSchema, prepareSchemaValue } from './json-schema.ts';
import type { FillItem, GrammarThreadInit, PreparedConstraint, ThreadReply, ThreadRequest } from './messages.ts';
import { loadGrammarVocabulary } from './vocabulary.ts';

export interface GrammarServiceSettings {
  modelDir: string;
  /** The model's logits. */
  vocabSize: number;
  eosTokenIds: readonly number[];
  maxNumSeqs: number;
  /** The model's grammar_threads; each holds its own xgrammar instance and vocabulary. */
  numThreads: number;
  /** Compiled grammars each thread keeps (64 by default). */
  maxCachedGrammars?: number;
  /** Fill masks while the forward pass runs (the default), or before it starts (a benchmark's reference). */
  overlapForward?: boolean;
  /**
   * The threads' Linux niceness (0, the default: the process's own). Where the forward pass's
   * threads take every core, a grammar compiling (tens to hundreds of milliseconds) takes a share
   * of one of them, and as the pass splits each layer evenly over its threads the whole pass waits
   * on the one that shares its core: a new schema slows every sequence's step up to 2x while it
   * compiles. A raised niceness keeps the pass at full speed but leaves the compile, and the mask
   * fills, to what the cores have spare: on a host whose other processes keep the cores busy the
   * grammar threads starve (measured: first sampled token 3.7x later). A raised niceness cannot be
   * lowered again without privilege, so it is the thread's for its life.
   */
  threadNice?: number;
}

/** What a step's masks look like to the runner (ForwardBatch's bitmask fields). */
export interface StepBitmasks {
  /** Indexed like the step's scheduled sequences: each one's row, or -1. */
  bitmaskRows: Int32Array;
  tokenBitmask: Int32Array;
  bitmaskWords: number;
  /** Null when the rows are complete before the pass starts. */
  bitmaskReady: Int32Array | null;
  bitmaskReadyTarget: number;
}

export interface PreparedOutput {
  key: string;
  constraint: PreparedConstraint;
  constrainAfter: string | null;
  jumpForward: boolean;
  prefixTokenIds: readonly number[];
}

/** One request's grammar, as the engine and scheduler see it. */
export class SequenceGrammar implements GrammarGate {
  isReady = false;
  failure: EngineError | null = null;
  /** Output tokens already sent to the matcher (or never to be: the prefix). */
  numAcceptedTokens: number;
  /** What the grammar forced before the last sampled token (jump-forward), from its last fill. */
  forcedText: string | null = null;
  thread: GrammarThread | null = null;
  /** Its thread holds it parsed, its compile over the vocabulary waiting for the forced start to be output (open() with deferCompile). */
  awaitsCompile = false;
  /**
   * Its compile was deferred and has now started: the thread fills its first mask right after it,
   * so a pass may sample it before isReady (Sequence.numSchedulableTokens, when it is alone).
   */
  maySampleCompiling = false;

  constructor(
    readonly requestId: string,
    readonly slot: number,
    readonly prepared: PreparedOutput,
    readonly stopTokenIds: readonly number[],
  ) {
    this.numAcceptedTokens = prepared.prefixTokenIds.length;
  }
}

class GrammarThread {
  worker: Worker | null = null;
  readonly grammars = new Set<SequenceGrammar>();
  /** The grammar keys compiled there, least recently used first (mirrors the thread's cache). */
  readonly keys = new Set<string>();
  /** This step's fills for the thread, drawn from itemPool: both kept from step to step. */
  readonly items: FillItem[] = [];
  readonly itemPool: FillItem[] = [];
  /** The rows of the fill it has not answered yet (0: none owed). */
  numPendingRows = 0;

  /** index: its place in the compiles the threads share (compute-threads.ts). */
  constructor(readonly index: number) {}

  /** A fill item for this step, reused from an earlier step where there is one. */
  nextItem(): FillItem {
    const item = this.itemPool[this.items.length] ?? { slot: 0, tokenIds: [], row: 0, jumpForward: false };
    if (this.items.length === this.itemPool.length) this.itemPool.push(item);
    this.items.push(item);
    return item;
  }
}

/** Each new sample weighs a quarter: a few compiles of a new kind of schema move it. */
function movingAverage(average: number | null, sample: number): number {
  return average === null ? sample : average + (sample - average) / 4;
}

function invalid(message: string): EngineError {
  return { code: 'invalid_request', message };
}

/** A structural tag with every JSON schema in it (tool calls' parameters) checked and prepared as a json_schema constraint's is. */
function prepareTagSchemas(tag: unknown): { tag: unknown } | EngineError {
  if (Array.isArray(tag)) {
    const items = [];
    for (const item of tag) {
      const prepared = prepareTagSchemas(item);
      if ('code' in prepared) return prepared;
      items.push(prepared.tag);
    }
    return { tag: items };
  }
  if (typeof tag !== 'object' || tag === null) return { tag };
  const node: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(tag)) {
    const isSchema = key === 'json_schema' && ((tag as { type?: unknown }).type === 'json_schema' || (tag as { type?: unknown }).type === 'qwen_xml_parameter');
    const prepared = isSchema ? prepareSchemaValue(value) : prepareTagSchemas(value);
    if ('code' in prepared) return prepared;
    node[key] = 'schema' in prepared ? prepared.schema : prepared.tag;
  }
  return { tag: node };
}

/** The constraint checked and made ready to compile, or why it cannot be. */
export function prepareStructuredOutput(structured: StructuredOutput, vocabSize: number): PreparedOutput | EngineError {
  const { constraint } = structured;
  let prepared: PreparedConstraint = constraint;
  switch (constraint.kind) {
    case 'json_schema': {
      const schema = prepareJsonSchema(constraint.schema);
      if ('code' in schema) return schema;
      prepared = { kind: 'json_schema', schema: schema.schema };
      break;
    }
    case 'regex':
      if (typeof constraint.pattern !== 'string' || constraint.pattern === '') return invalid('A regex structured output needs a pattern');
      break;
    case 'choice':
      if (!Array.isArray(constraint.choices) || constraint.choices.length === 0 || constraint.choices.some((choice) => typeof choice !== 'string' || choice === '')) {
        return invalid('A choice structured output needs one or more non-empty strings');
      }
      break;
    case 'grammar':
      if (typeof constraint.grammar !== 'string' || constraint.grammar.trim() === '') return invalid('A grammar structured output needs a grammar');
      break;
    case 'structural_tag': {
      let tag: unknown;
      try {
        tag = JSON.parse(constraint.structuralTag);
        if (typeof tag !== 'object' || tag === null || Array.isArray(tag)) throw new Error('not an object');
      } catch (err) {
        return invalid(`A structural tag must be a JSON object: ${(err as Error).message}`);
      }
      const schemas = prepareTagSchemas(tag);
      if ('code' in schemas) return schemas;
      prepared = { kind: 'structural_tag', structuralTag: JSON.stringify(schemas.tag) };
      break;
    }
    case 'json_object':
      break;
    default:
      return invalid(`Unknown structured output kind ${JSON.stringify((constraint as { kind: unknown }).kind)}`);
  }
  const constrainAfter = structured.constrainAfter ?? null;
  if (constrainAfter !== null && (typeof constrainAfter !== 'string' || constrainAfter === '')) return invalid('constrainAfter must be a non-empty string');
  const prefixTokenIds = structured.prefixTokenIds ?? [];
  if (!Array.isArray(prefixTokenIds) || prefixTokenIds.some((id) => !Number.isInteger(id) || id < 0 || id >= vocabSize)) {
    return invalid(`prefixTokenIds must be token ids below ${vocabSize}`);
  }
  if (prefixTokenIds.length > 0 && constrainAfter !== null) return invalid('prefixTokenIds cannot come with constrainAfter');
  return { key: JSON.stringify([prepared, constrainAfter]), constraint: prepared, constrainAfter, jumpForward: structured.jumpForward ?? true, prefixTokenIds };
}

/**
 * Compiled (dist/), the thread is thread.js beside this module; from the sources (tests under
 * tsx) a bootstrap registers tsx in the thread first, as Node 20 passes no loader hooks on.
 */
function startThread(init: GrammarThreadInit): Worker {
  if (import.meta.url.endsWith('.js')) return new Worker(new URL('./thread.js', import.meta.url), { workerData: init });
  const bootstrap = `import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then((tsx) => {
  tsx.register();
  return import(${JSON.stringify(new URL('./thread.ts', import.meta.url).href)});
});`;
  return new Worker(bootstrap, { eval: true, workerData: init });
}

export class GrammarService {
  readonly overlapForward: boolean;
  private readonly settings: GrammarServiceSettings;
  private readonly init: GrammarThreadInit;
  private readonly threads: GrammarThread[];
  private readonly bySlot = new Map<number, SequenceGrammar>();
  private readonly byRequest = new Map<string, SequenceGrammar>();
  private readonly failures: SequenceGrammar[] = [];
  /** Forced starts to output: a prefix of token ids (at open), or the text a grammar forces from its start. */
  private readonly prefixes: Array<{ grammar: SequenceGrammar; tokenIds: readonly number[] | null; text: string }> = [];
  private readonly bitmaskRows: Int32Array;
  private readonly tokenBitmask: Int32Array;
  private readonly ready: Int32Array;
  private forcedTokenizer: ForcedTokenizer | null = null;
  private nextSlot = 0;
  private step = 0;
  private pendingStep: Promise<void> | null = null;
  /** Threads yet to answer the last fillStep(), and what resolves pendingStep when none are. */
  private numPendingThreads = 0;
  private resolveStep: () => void = () => {};
  private isClosed = false;
  /** Recent compiles over the vocabulary, in milliseconds of their thread (a moving average); null before the first. */
  compileMsEstimate: number | null = null;
  /** Called when a grammar becomes ready or fails: the engine loop may have something to do. */
  onChange: () => void = () => {};

  constructor(settings: GrammarServiceSettings) {
    this.settings = settings;
    this.overlapForward = settings.overlapForward ?? true;
    const words = Math.ceil(settings.vocabSize / 32);
    const bitmask = new SharedArrayBuffer(settings.maxNumSeqs * words * 4);
    const ready = new SharedArrayBuffer(4);
    this.init = {
      modelDir: settings.modelDir,
      vocabSize: settings.vocabSize,
      words,
      eosTokenIds: [...settings.eosTokenIds],
      bitmask,
      ready,
      maxCachedGrammars: settings.maxCachedGrammars ?? 64,
      nice: settings.threadNice ?? 0,
      computeThreads: null,
      threadIndex: 0,
    };
    this.threads = Array.from({ length: Math.max(1, settings.numThreads) }, (_, index) => new GrammarThread(index));
    this.bitmaskRows = new Int32Array(settings.maxNumSeqs);
    this.tokenBitmask = new Int32Array(bitmask);
    this.ready = new Int32Array(ready);
  }

  /**
   * The model's compute threads, which leave compiling grammar threads their cores
   * (compute-threads.ts): set before the first open.
   */
  shareComputeThreads(cell: Int32Array, numComputeThreads: number, numCores: number): void {
    const numBusyJobs = new Int32Array(new SharedArrayBuffer(4 * this.threads.length));
    this.init.computeThreads = { cell, numBusyJobs, numComputeThreads, numCores };
  }

  /** A grammar for a request (not yet compiling): the scheduler's gate until open() starts it. */
  create(requestId: string, prepared: PreparedOutput, stopTokenIds: readonly number[]): SequenceGrammar {
    return new SequenceGrammar(requestId, this.nextSlot++, prepared, stopTokenIds);
  }

  /**
   * Starts compiling (or takes from a thread's cache) and opens the matcher. With deferCompile, a
   * grammar not cached that forces a start is compiled only over bytes now (its forced start,
   * about a millisecond), and over the vocabulary once that start is output
   * (takeForcedStarts()), after the pass that computed the prompt: the vocabulary's compile is
   * needed only by the first masked sample, which comes after the pass that computes the forced
   * tokens, so a short prompt's pass does not share its cores with it.
   */
  open(grammar: SequenceGrammar, deferCompile = false): void {
    if (this.isClosed) {
      this.fail(grammar, { code: 'engine_unavailable', message: 'The engine worker is shutting down' });
      return;
    }
    const thread = this.threadFor(grammar.prepared.key);
    const isCached = thread.keys.has(grammar.prepared.key);
    if (!isCached) this.startCompiling(thread);
    grammar.thread = thread;
    thread.grammars.add(grammar);
    thread.keys.delete(grammar.prepared.key);
    thread.keys.add(grammar.prepared.key);
    for (const key of thread.keys) {
      if (thread.keys.size <= this.init.maxCachedGrammars) break;
      thread.keys.delete(key);
    }
    this.bySlot.set(grammar.slot, grammar);
    this.byRequest.set(grammar.requestId, grammar);
    const { key, constraint, constrainAfter } = grammar.prepared;
    const { jumpForward } = grammar.prepared;
    this.post(thread, { kind: 'open', slot: grammar.slot, key, constraint, constrainAfter, stopTokenIds: [...grammar.stopTokenIds], jumpForward, deferCompile: deferCompile && !isCached, countsCompile: !isCached });
    if (grammar.prepared.prefixTokenIds.length > 0) {
      this.prefixes.push({ grammar, tokenIds: grammar.prepared.prefixTokenIds, text: '' });
      this.onChange();
    }
  }

  /**
   * Grammar threads busy now (compiling, or filling a few rows' masks): each takes a core until
   * its busy jobs end, which the engine leaves it (compute-threads.ts).
   */
  get numBusyGrammarThreads(): number {
    const shared = this.init.computeThreads;
    return shared === null ? 0 : numBusyGrammarThreads(shared.numBusyJobs);
  }

  /** Frees the request's matcher; its grammar stays cached in its thread. */
  close(requestId: string): void {
    const grammar = this.byRequest.get(requestId);
    if (grammar === undefined) return;
    this.byRequest.delete(requestId);
    this.bySlot.delete(grammar.slot);
    const thread = grammar.thread;
    if (thread === null || !thread.grammars.delete(grammar)) return;
    this.post(thread, { kind: 'close', slot: grammar.slot });
  }

  /** Grammars that failed (to compile, or to accept a token) since the last call. */
  takeFailures(): SequenceGrammar[] {
    return this.failures.splice(0);
  }

  /**
   * The tokens each new grammar forces from its start, known before it compiles (jump-forward's
   * first step: the grammar's start compiled over bytes alone), for requests that have no output
   * yet: they are output at once, and computed with the prompt.
   */
  takeForcedStarts(): Array<{ requestId: string; tokenIds: readonly number[]; numOutputTokensBefore: number }> {
    const starts = [];
    for (const { grammar, tokenIds: prefix, text } of this.prefixes.splice(0)) {
      if (grammar.failure !== null || this.byRequest.get(grammar.requestId) !== grammar) continue;
      // Its forced start goes out now: the compile it waited for starts.
      if (grammar.awaitsCompile) this.compileDeferred(grammar);
      // The prefix is output at open, the grammar's forced start after it.
      const numPrefixTokens = grammar.prepared.prefixTokenIds.length;
      if (prefix !== null) starts.push({ requestId: grammar.requestId, tokenIds: prefix, numOutputTokensBefore: 0 });
      const tokenIds = prefix === null ? this.tokenizer().forcedStart(text) : [];
      if (tokenIds.length > 0) starts.push({ requestId: grammar.requestId, tokenIds, numOutputTokensBefore: numPrefixTokens });
    }
    return starts;
  }

  /**
   * Posts this step's fills to the threads and returns the runner's bitmask fields at once;
   * null when no scheduled sequence samples under a grammar.
   */
  fillStep(scheduled: readonly ScheduledSequence[]): StepBitmasks | null {
    for (const thread of this.threads) thread.items.length = 0;
    let numRows = 0;
    for (let index = 0; index < scheduled.length; index++) {
      const entry = scheduled[index];
      this.bitmaskRows[index] = -1;
      if (!entry.sample || entry.grammar === null) continue;
      const grammar = this.byRequest.get(entry.requestId);
      if (grammar === undefined || grammar.failure !== null || grammar.thread === null) continue;
      const firstUnseen = entry.tokenIds.length - entry.numOutputTokens + grammar.numAcceptedTokens;
      grammar.numAcceptedTokens = entry.numOutputTokens;
      grammar.forcedText = null;
      const item = grammar.thread.nextItem();
      item.slot = grammar.slot;
      item.tokenIds.length = 0;
      for (let position = firstUnseen; position < entry.tokenIds.length; position++) item.tokenIds.push(entry.tokenIds[position]);
      item.row = numRows;
      item.jumpForward = grammar.prepared.jumpForward;
      this.bitmaskRows[index] = numRows++;
    }
    if (numRows === 0) return null;
    // Last step's rows were all counted before its pass sampled, and its fills have answered.
    Atomics.store(this.ready, 0, 0);
    const step = ++this.step;
    this.pendingStep = new Promise<void>((resolve) => (this.resolveStep = resolve));
    // A few rows fill in a fraction of the pass, which loses little by leaving their threads
    // their cores; many rows fill for most of it, and the pass keeps every compute thread.
    const yieldsCore = numRows <= this.threads.length;
    for (const thread of this.threads) {
      if (thread.items.length === 0) continue;
      thread.numPendingRows = thread.items.length;
      this.numPendingThreads++;
      // Cloned as it is posted: the items are free to reuse at once.
      this.post(thread, { kind: 'fill', step, items: thread.items, yieldsCore });
    }
    return {
      bitmaskRows: this.bitmaskRows,
      tokenBitmask: this.tokenBitmask,
      bitmaskWords: this.init.words,
      bitmaskReady: this.overlapForward ? this.ready : null,
      bitmaskReadyTarget: numRows,
    };
  }

  /** Resolves once every thread has answered the last fillStep() (the rows are written). */
  async stepDone(): Promise<void> {
    const pending = this.pendingStep;
    this.pendingStep = null;
    await pending;
  }

  /**
   * The last forcedTokens() call's scheduled indices whose samples must not be output: their
   * grammar failed by the pass's end (its compile, a token it rejected, its thread lost), and its
   * mask row, written empty, constrained nothing. The request ends with the grammar's error
   * (takeFailures()) before its next step. Reused from step to step.
   */
  readonly withheld: number[] = [];

  /**
   * After the pass: for each scheduled sequence that sampled under a grammar that forced more
   * than its sampled token spelled, the tokens to emit without sampling (indexed like scheduled).
   */
  forcedTokens(scheduled: readonly ScheduledSequence[], sampledTokenIds: Int32Array): Array<readonly number[] | undefined> | null {
    let forced: Array<readonly number[] | undefined> | null = null;
    this.withheld.length = 0;
    for (let index = 0; index < scheduled.length; index++) {
      const entry = scheduled[index];
      if (!entry.sample || entry.grammar === null) continue;
      const grammar = this.byRequest.get(entry.requestId);
      if (grammar?.failure != null) this.withheld.push(index);
      if (grammar === undefined || grammar.forcedText === null || grammar.failure !== null) continue;
      const tokenIds = this.tokenizer().forcedAfter(grammar.forcedText, sampledTokenIds[index]);
      grammar.forcedText = null;
      if (tokenIds.length === 0) continue;
      forced ??= [];
      forced[index] = tokenIds;
    }
    return forced;
  }

  async shutdown(): Promise<void> {
    this.isClosed = true;
    await Promise.all(this.threads.map(async (thread) => {
      const worker = thread.worker;
      thread.worker = null;
      await worker?.terminate();
    }));
  }

  private tokenizer(): ForcedTokenizer {
    this.forcedTokenizer ??= new ForcedTokenizer(loadGrammarVocabulary(this.settings.modelDir, this.settings.vocabSize));
    return this.forcedTokenizer;
  }

  private threadFor(key: string): GrammarThread {
    const cached = this.threads.find((thread) => thread.worker !== null && thread.keys.has(key));
    if (cached !== undefined) return cached;
    // A thread compiling holds up the masks of the sequences it serves: a new grammar goes to
    // an idle thread (starting one if need be) before a busy one.
    const idle = this.threads.find((thread) => thread.worker !== null && thread.grammars.size === 0) ?? this.threads.find((thread) => thread.worker === null);
    const thread = idle ?? this.threads.reduce((best, candidate) => (candidate.grammars.size < best.grammars.size ? candidate : best));
    if (thread.worker === null) this.spawn(thread);
    return thread;
  }

  private spawn(thread: GrammarThread): void {
    const worker = startThread({ ...this.init, threadIndex: thread.index });
    thread.worker = worker;
    thread.keys.clear();
    worker.on('message', (reply: ThreadReply) => this.receive(thread, reply));
    worker.on('error', (err) => this.lose(thread, worker, err.message));
    worker.on('exit', (code) => this.lose(thread, worker, `exited with code ${code}`));
    worker.unref();
  }

  private post(thread: GrammarThread, request: ThreadRequest): void {
    thread.worker?.postMessage(request);
    this.holdLoop(thread);
  }

  /**
   * A thread keeps the process alive while it has work (open grammars, a fill to answer): the
   * engine may be waiting on nothing else. An idle one does not hold a closing process.
   */
  private holdLoop(thread: GrammarThread): void {
    if (thread.grammars.size > 0 || thread.numPendingRows > 0) thread.worker?.ref();
    else thread.worker?.unref();
  }

  private receive(thread: GrammarThread, reply: ThreadReply): void {
    if (reply.kind === 'prefix') {
      const grammar = this.bySlot.get(reply.slot);
      // Its bytes are compiled (the thread has ended its compile); it waits for compileDeferred() (or close()).
      if (reply.deferred && grammar !== undefined) grammar.awaitsCompile = true;
      if (grammar === undefined || grammar.isReady || reply.text === '') return;
      this.prefixes.push({ grammar, tokenIds: null, text: reply.text });
      this.onChange();
      return;
    }
    if (reply.kind === 'opened') {
      // Also for a request closed meanwhile: the thread compiled its grammar all the same.
      if (reply.compileMs > 0) this.compileMsEstimate = movingAverage(this.compileMsEstimate, reply.compileMs);
      const grammar = this.bySlot.get(reply.slot);
      if (grammar === undefined) return;
      grammar.maySampleCompiling = false;
      if (reply.error === null) grammar.isReady = true;
      else this.fail(grammar, invalid(`The structured output could not be compiled: ${reply.error}`));
      this.onChange();
      return;
    }
    for (const result of reply.results) {
      const grammar = this.bySlot.get(result.slot);
      if (grammar === undefined) continue;
      if (result.error === null) grammar.forcedText = result.forcedText;
      else this.fail(grammar, { code: 'internal_error', message: `Structured output: ${result.error}` });
    }
    if (reply.step !== this.step || thread.numPendingRows === 0) return;
    this.answered(thread);
  }

  /** The thread compiles a deferred grammar now; its first fill queues behind the compile. */
  private compileDeferred(grammar: SequenceGrammar): void {
    const thread = grammar.thread!;
    grammar.awaitsCompile = false;
    grammar.maySampleCompiling = true;
    this.startCompiling(thread);
    this.post(thread, { kind: 'compile', slot: grammar.slot });
  }

  /** Counts a compile posted to the thread, which ends it (thread.ts): the compute threads leave it a core from now. */
  private startCompiling(thread: GrammarThread): void {
    if (this.init.computeThreads !== null) changeBusyJobs(this.init.computeThreads, thread.index, 1);
  }

  /** The thread owes no more rows this step; the step is done when no thread does. */
  private answered(thread: GrammarThread): void {
    thread.numPendingRows = 0;
    this.holdLoop(thread);
    if (--this.numPendingThreads === 0) this.resolveStep();
  }

  /** A thread that died fails its sequences, and counts the rows it owed so no pass waits for them. */
  private lose(thread: GrammarThread, worker: Worker, why: string): void {
    if (thread.worker !== worker) return;
    thread.worker = null;
    thread.keys.clear();
    // It ends no busy job any more.
    const shared = this.init.computeThreads;
    if (shared !== null) changeBusyJobs(shared, thread.index, -Atomics.load(shared.numBusyJobs, thread.index));
    if (thread.numPendingRows > 0) {
      Atomics.add(this.ready, 0, thread.numPendingRows);
      this.answered(thread);
    }
    for (const grammar of thread.grammars) this.fail(grammar, { code: 'internal_error', message: `A grammar thread stopped: ${why}` });
    thread.grammars.clear();
    this.onChange();
  }

  private fail(grammar: SequenceGrammar, error: EngineError): void {
    if (grammar.failure !== null) return;
    grammar.failure = error;
    this.failures.push(grammar);
  }
}

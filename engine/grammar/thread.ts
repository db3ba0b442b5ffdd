// One grammar thread: its own xgrammar instance (WebAssembly, single-threaded) over the model's
// vocabulary, a cache of compiled grammars by key, and the matchers of the sequences it serves.
// A compiled grammar lives in the instance that compiled it, so a sequence's matcher lives here
// too, and every step's masks for it are filled here: straight into the shared bitmask rows the
// native sampler reads, each row counted on the shared ready counter as soon as it is written.
// Messages are handled one at a time, in order.
import os from 'node:os';
import v8 from 'node:v8';
import { parentPort, workerData } from 'node:worker_threads';
import type { GrammarThreadInit, ThreadReply, ThreadRequest, PreparedConstraint, FillItem } from './messages.ts';
import { byteLevelAlphabet, loadGrammarVocabulary } from './vocabulary.ts';
import { hasRangeMarkers, replaceRangeMarkers } from './number-range.ts';
import { loadXgrammar } from './xgrammar.ts';
import { changeBusyJobs } from '../compute-threads.ts';
import type { CompiledGrammar, Grammar, GrammarCompiler, GrammarMatcher, StructuralTagFormat } from '@mlc-ai/web-xgrammar';

const init = workerData as GrammarThreadInit;
// On Linux a priority set for "this process" (pid 0) applies to the calling thread alone;
// elsewhere it would lower the whole process, forward pass included, so it is left alone.
if (init.nice !== 0 && process.platform === 'linux') {
  try {
    os.setPriority(init.nice);
  } catch {
    // Refused (a sandbox without setpriority): the thread keeps the process's priority.
  }
}
/**
 * Where xgrammar's diagnostics go ("[FATAL] file:line: why" before it aborts, and warnings): it
 * binds console's methods once, as it loads, so they are routed through here first.
 */
let diagnostics: string[] | null = null;
for (const method of ['log', 'warn', 'error'] as const) {
  const original = console[method].bind(console);
  console[method] = (...args: unknown[]) => (diagnostics === null ? original(...args) : diagnostics.push(args.map(String).join(' ')));
}
// V8 runs WebAssembly first in its baseline tier (Liftoff) and optimizes a function only after it
// has spent a budget of work there, so a new thread compiles and fills masks slowly for a while:
// an agent's schema took 1.5-2x as long in a thread's first opens, its very first 2x (the
// vocabulary's TokenizerInfo included). A budget of 1 has each function optimized in the
// background from its first call. The flag is the process's,
// read as a module is instantiated (so it is set before xgrammar's exists); for any other
// WebAssembly in the process it only means optimized code sooner.
v8.setFlagsFromString('--wasm-tiering-budget=1');
const xgrammar = loadXgrammar();
const bitmask = new Int32Array(init.bitmask);
const ready = new Int32Array(init.ready);
const compiled = new Map<string, CompiledGrammar>();
const matchers = new Map<number, GrammarMatcher>();
let compiler: GrammarCompiler | null = null;
let byteCompiler: GrammarCompiler | null = null;

/** JSON on one line, with the separators Python's json.dumps (and most training data) uses. */
const JSON_OPTIONS = [false, -1, [', ', ': '] as [string, string], true] as const;

async function compilerOf(): Promise<GrammarCompiler> {
  if (compiler !== null) return compiler;
  const vocabulary = loadGrammarVocabulary(init.modelDir, init.vocabSize);
  const info = await xgrammar.TokenizerInfo.createTokenizerInfo(
    vocabulary.encodedTokens,
    vocabulary.vocabType,
    vocabulary.prependSpace,
    init.vocabSize,
    init.eosTokenIds,
  );
  compiler = await xgrammar.GrammarCompiler.createGrammarCompiler(info, false);
  return compiler;
}

/**
 * A JSON schema (text or value) as EBNF with JSON_OPTIONS' layout (a structural tag's own
 * json_schema allows any whitespace, in which small models drown), its bounded numbers' markers
 * replaced by their ranges' grammars.
 */
async function schemaGrammar(schema: unknown): Promise<string> {
  return replaceRangeMarkers(await xgrammar.Testings._jsonSchemaToEBNF(typeof schema === 'string' ? schema : JSON.stringify(schema), ...JSON_OPTIONS));
}

/** The tag with each JSON schema in it turned into a grammar of the same layout as a json_schema constraint's. */
async function withSchemaGrammars(format: unknown): Promise<unknown> {
  if (Array.isArray(format)) return Promise.all(format.map(withSchemaGrammars));
  if (typeof format !== 'object' || format === null) return format;
  const node = format as Record<string, unknown>;
  if (node.type === 'json_schema') return { type: 'grammar', grammar: await schemaGrammar(node.json_schema) };
  return Object.fromEntries(await Promise.all(Object.entries(node).map(async ([key, value]) => [key, await withSchemaGrammars(value)] as const)));
}

/**
 * A compiler over the 256 bytes alone (and a stop token): compiling against it takes
 * milliseconds where the model's vocabulary takes up to seconds, and what a grammar forces is the
 * same bytes whatever the vocabulary, so it tells the forced start of a grammar not yet compiled.
 */
async function byteCompilerOf(): Promise<GrammarCompiler> {
  if (byteCompiler !== null) return byteCompiler;
  const bytes = Array.from({ length: 256 }, (_, b) => BYTE_CHARS[b]);
  const info = await xgrammar.TokenizerInfo.createTokenizerInfo([...bytes, ''], 'byte_level', false, 257, [256]);
  byteCompiler = await xgrammar.GrammarCompiler.createGrammarCompiler(info, false);
  return byteCompiler;
}

/** GPT-2's byte-level alphabet, as vocabulary.ts builds it. */
const BYTE_CHARS = byteLevelAlphabet();

function formatOf(constraint: PreparedConstraint): StructuralTagFormat {
  switch (constraint.kind) {
    case 'json_schema':
      return { type: 'json_schema', json_schema: JSON.parse(constraint.schema) };
    case 'json_object':
      return { type: 'json_schema', json_schema: { type: 'object' } };
    case 'regex':
      return { type: 'regex', pattern: constraint.pattern };
    case 'choice':
      return { type: 'or', elements: constraint.choices.map((value) => ({ type: 'const_string', value })) };
    case 'grammar':
      return { type: 'grammar', grammar: constraint.grammar };
    case 'structural_tag': {
      const tag = JSON.parse(constraint.structuralTag) as { format?: StructuralTagFormat };
      return tag.format ?? (tag as StructuralTagFormat);
    }
  }
}

/**
 * The constraint as one xgrammar Grammar (parsed and converted once), which the thread compiles
 * over bytes for its forced start and over the vocabulary for its masks.
 */
async function grammarOf(constraint: PreparedConstraint, constrainAfter: string | null): Promise<Grammar> {
  if (constrainAfter !== null) {
    const format: StructuralTagFormat = {
      type: 'sequence',
      elements: [{ type: 'tag', begin: '', content: { type: 'any_text' }, end: constrainAfter }, formatOf(constraint)],
    };
    return xgrammar.Grammar.fromStructuralTag({ type: 'structural_tag', format: (await withSchemaGrammars(format)) as StructuralTagFormat });
  }
  switch (constraint.kind) {
    case 'structural_tag':
      return xgrammar.Grammar.fromStructuralTag({ type: 'structural_tag', format: (await withSchemaGrammars(formatOf(constraint))) as StructuralTagFormat });
    case 'json_schema':
      // Bounded numbers are markers in the schema, replaced in its EBNF (number-range.ts).
      if (hasRangeMarkers(constraint.schema)) return xgrammar.Grammar.fromEBNF(await schemaGrammar(constraint.schema));
      return xgrammar.Grammar.fromJSONSchema(constraint.schema, ...JSON_OPTIONS);
    case 'json_object':
      return xgrammar.Grammar.fromJSONSchema('{"type": "object"}', ...JSON_OPTIONS);
    case 'grammar':
      return xgrammar.Grammar.fromEBNF(constraint.grammar);
    default:
      return xgrammar.Grammar.fromStructuralTag({ type: 'structural_tag', format: formatOf(constraint) });
  }
}

/**
 * Runs fn with xgrammar's diagnostics (it prints "[FATAL] file:line: why" before aborting, and
 * warnings) collected rather than printed; a failure's message is its last diagnostic.
 */
async function withDiagnostics<T>(fn: () => Promise<T>): Promise<T> {
  const collected: string[] = [];
  diagnostics = collected;
  try {
    return await fn();
  } catch (err) {
    const fatal = collected.filter((line) => line.startsWith('[FATAL]') || line.startsWith('[ERROR]')).at(-1);
    throw new Error(fatal?.replace(/^\[\w+\]\s*\S+:\d+:\s*/, '') ?? (err instanceof Error ? err.message : String(err)));
  } finally {
    diagnostics = null;
  }
}

/** The text a grammar forces from its start, by its matcher; '' when none. */
async function forcedStartOf(grammar: CompiledGrammar): Promise<string> {
  const matcher = await xgrammar.GrammarMatcher.createGrammarMatcher(grammar);
  try {
    return matcher.findJumpForwardString();
  } finally {
    matcher.dispose();
  }
}

/**
 * Ends a compile the engine counted (compute-threads.ts): stored here, the compute threads rejoin
 * the pass running now at its next op, not once the event loop reads this thread's reply.
 */
function endCompile(): void {
  if (init.computeThreads !== null) changeBusyJobs(init.computeThreads, init.threadIndex, -1);
}

/** Grammars parsed whose compile over the vocabulary waits for their slot's 'compile' request, by slot. */
const deferred = new Map<number, { key: string; source: Grammar; stopTokenIds: number[] }>();

/**
 * The forced start first (from the cached grammar, or the grammar compiled over bytes alone, so it
 * comes at once), then the grammar compiled and its matcher opened; or, deferred, only when the
 * slot's 'compile' request comes (null: nothing to reply yet).
 */
async function open(request: Extract<ThreadRequest, { kind: 'open' }>): Promise<ThreadReply | null> {
  const { slot, key, constraint, constrainAfter, stopTokenIds, jumpForward, deferCompile } = request;
  let compiling = request.countsCompile;
  let source: Grammar | null = null;
  try {
    const grammar = compiled.get(key);
    if (grammar === undefined) source = await withDiagnostics(async () => grammarOf(constraint, constrainAfter));
    if (jumpForward) {
      try {
        const overBytes = grammar ?? (await withDiagnostics(async () => (await byteCompilerOf()).compileGrammar(source!)));
        const text = await forcedStartOf(overBytes);
        if (overBytes !== grammar) overBytes.dispose();
        const defers = grammar === undefined && deferCompile && text !== '';
        // Its byte phase is all it compiles until the slot's 'compile' request.
        if (defers && compiling) {
          compiling = false;
          endCompile();
        }
        parentPort!.postMessage({ kind: 'prefix', slot, text, deferred: defers } satisfies ThreadReply);
        if (defers) {
          deferred.set(slot, { key, source: source!, stopTokenIds });
          source = null;
          return null;
        }
      } catch {
        // The full compile below reports what is wrong with the grammar.
      }
    }
    return await opened(slot, key, grammar ?? source!, stopTokenIds);
  } catch (err) {
    return { kind: 'opened', slot, error: (err as Error).message, cached: false, compileMs: 0 };
  } finally {
    // The compiled grammar keeps what it needs of it.
    source?.dispose();
    if (compiling) endCompile();
  }
}

/** A deferred grammar compiled over the vocabulary, its matcher opened. */
async function compileDeferred(slot: number): Promise<ThreadReply | null> {
  const pending = deferred.get(slot);
  deferred.delete(slot);
  try {
    return pending === undefined ? null : await opened(slot, pending.key, pending.source, pending.stopTokenIds);
  } catch (err) {
    return { kind: 'opened', slot, error: (err as Error).message, cached: false, compileMs: 0 };
  } finally {
    pending?.source.dispose();
    endCompile();
  }
}

/** The grammar (compiled, or its source to compile and cache under key) with a matcher open for the slot. */
async function opened(slot: number, key: string, grammarOrSource: CompiledGrammar | Grammar, stopTokenIds: number[]): Promise<ThreadReply> {
  let grammar = compiled.get(key);
  const cached = grammar !== undefined;
  let compileMs = 0;
  if (grammar === undefined) {
    const source = grammarOrSource as Grammar;
    const vocabularyCompiler = await withDiagnostics(compilerOf);
    const started = performance.now();
    grammar = await withDiagnostics(async () => vocabularyCompiler.compileGrammar(source));
    compileMs = performance.now() - started;
    compiled.set(key, grammar);
    evictBeyond(init.maxCachedGrammars);
  } else {
    // Most recently used last.
    compiled.delete(key);
    compiled.set(key, grammar);
  }
  matchers.set(slot, await xgrammar.GrammarMatcher.createGrammarMatcher(grammar, stopTokenIds));
  return { kind: 'opened', slot, error: null, cached, compileMs };
}

function evictBeyond(maxEntries: number): void {
  for (const [key, grammar] of compiled) {
    if (compiled.size <= maxEntries) return;
    // Matchers keep what they use alive; only the cache's hold goes.
    grammar.dispose();
    compiled.delete(key);
  }
}

/** Accepts the item's tokens, notes the forced text, writes the mask row; the row is counted whatever happens. */
async function fillOne(item: FillItem): Promise<{ slot: number; forcedText: string | null; error: string | null }> {
  const rowStart = item.row * init.words;
  try {
    const matcher = matchers.get(item.slot);
    if (matcher === undefined) throw new Error('no grammar is open for this sequence');
    for (const tokenId of item.tokenIds) {
      if (!matcher.acceptToken(tokenId)) throw new Error(`the grammar rejected token ${tokenId}`);
    }
    const forcedText = item.jumpForward ? matcher.findJumpForwardString() : null;
    bitmask.set(await matcher.getNextTokenBitmask(), rowStart);
    return { slot: item.slot, forcedText, error: null };
  } catch (err) {
    bitmask.fill(0, rowStart, rowStart + init.words);
    return { slot: item.slot, forcedText: null, error: (err as Error).message };
  } finally {
    Atomics.add(ready, 0, 1);
  }
}

async function handle(request: ThreadRequest): Promise<ThreadReply | null> {
  switch (request.kind) {
    case 'open':
      return open(request);
    case 'compile':
      return compileDeferred(request.slot);
    case 'fill': {
      // A busy job like a compile while it runs (compute-threads.ts), ended here as it ends.
      const shared = request.yieldsCore ? init.computeThreads : null;
      if (shared !== null) changeBusyJobs(shared, init.threadIndex, 1);
      try {
        const results = [];
        for (const item of request.items) results.push(await fillOne(item));
        return { kind: 'filled', step: request.step, results };
      } finally {
        if (shared !== null) changeBusyJobs(shared, init.threadIndex, -1);
      }
    }
    case 'close':
      matchers.get(request.slot)?.dispose();
      matchers.delete(request.slot);
      deferred.get(request.slot)?.source.dispose();
      deferred.delete(request.slot);
      return null;
  }
}

let queue = Promise.resolve();
parentPort!.on('message', (request: ThreadRequest) => {
  queue = queue.then(async () => {
    const reply = await handle(request);
    if (reply !== null) parentPort!.postMessage(reply);
  });
});

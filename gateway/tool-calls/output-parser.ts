// Splits a model's output, as it streams, into what OpenAI's responses carry apart: reasoning
// (a <think> section), content, and tool calls in the model family's format (families.ts). Fed
// the same text, in any chunks, it reports the same things: a non-streamed response runs the
// same parser over the whole text, so the two always agree. Text that might still become a tag
// or a marker is held back until it is known, as stop strings are.
//
// A call is announced (its id and name) once its name is read, then its arguments stream as the
// model writes them. A call cut off before its object closes (max_tokens) is not a call: it is
// left out of toolCalls, as is the text of one that turns out not to be a call object at all,
// which becomes content.
import { randomBytes } from 'node:crypto';
import { CallScanner } from './call-scanner.ts';
import type { CallSyntax, ReasoningTags } from './families.ts';

export type OutputEvent =
  | { kind: 'reasoning'; text: string }
  | { kind: 'content'; text: string }
  /** A call begins: its index among the output's calls, its id and the function's name. */
  | { kind: 'call'; index: number; id: string; name: string }
  /** The next piece of a call's arguments, as written. */
  | { kind: 'arguments'; index: number; text: string };

export interface ParsedToolCall {
  id: string;
  name: string;
  /** The arguments exactly as the model wrote them (a JSON object's text, when it followed the format). */
  arguments: string;
}

export interface OutputParserOptions {
  /** A reasoning model's think tags; null for others. */
  reasoning: ReasoningTags | null;
  /** Where the prompt left the think section (families.ts reasoningStateOf). */
  reasoningState: 'open' | 'closed' | 'none';
  /** The family's call syntax; null when the request offers no tools (all text is content). */
  toolCalls: CallSyntax | null;
}

type Mode = 'thinkStart' | 'think' | 'afterThink' | 'answerStart' | 'content' | 'calls' | 'afterCall';

const LEADING_SPACE = /^\s*/;

/** The longest end of text that begins tag (a tag that may be arriving), so it is held back. */
function partialTagLength(text: string, tag: string): number {
  for (let length = Math.min(tag.length - 1, text.length); length > 0; length--) {
    if (tag.startsWith(text.slice(text.length - length))) return length;
  }
  return 0;
}

function newCallId(): string {
  return `call_${randomBytes(12).toString('hex')}`;
}

export class OutputParser {
  private readonly options: OutputParserOptions;
  private mode: Mode;
  private pending = '';
  private isFinal = false;
  private events: OutputEvent[] = [];
  /** The current call's scanner, from its object's first character. */
  private scanner: CallScanner | null = null;
  /** Text of the current call region not yet reported: its marker, and the object until the call is announced. */
  private regionText = '';
  private announced: { index: number; id: string; name: string } | null = null;
  private numArgumentChars = 0;
  private isInArray = false;
  reasoning = '';
  content = '';
  readonly toolCalls: ParsedToolCall[] = [];
  /** A call was cut off before its object closed. */
  hasIncompleteCall = false;

  constructor(options: OutputParserOptions) {
    this.options = options;
    const { reasoning, reasoningState } = options;
    this.mode = reasoning === null || reasoningState === 'closed' ? 'answerStart' : reasoningState === 'open' ? 'think' : 'thinkStart';
  }

  push(text: string): OutputEvent[] {
    this.pending += text;
    this.run();
    return this.take();
  }

  /** The output is over: whatever was held back is settled. */
  finish(): OutputEvent[] {
    this.isFinal = true;
    this.run();
    if (this.mode === 'calls' && this.scanner !== null) this.hasIncompleteCall = true;
    if (this.mode === 'think' && this.pending !== '') this.emit({ kind: 'reasoning', text: this.pending });
    // Blank space after the last call was only a separator.
    const isSeparator = this.toolCalls.length > 0 && this.pending.trim() === '';
    if (this.mode === 'content' && !isSeparator) this.emit({ kind: 'content', text: this.pending });
    this.pending = '';
    return this.take();
  }

  private take(): OutputEvent[] {
    const events = this.events;
    this.events = [];
    return events;
  }

  private emit(event: OutputEvent): void {
    if ((event.kind === 'content' || event.kind === 'reasoning' || event.kind === 'arguments') && event.text === '') return;
    if (event.kind === 'content') this.content += event.text;
    else if (event.kind === 'reasoning') this.reasoning += event.text;
    const last = this.events.at(-1);
    if (last !== undefined && last.kind === event.kind && (event.kind === 'content' || event.kind === 'reasoning')) {
      this.events[this.events.length - 1] = { kind: event.kind, text: (last as { text: string }).text + event.text };
      return;
    }
    this.events.push(event);
  }

  /** Advances through the pending text until it needs more. */
  private run(): void {
    for (;;) {
      const before = this.mode;
      const pendingBefore = this.pending.length;
      this.step();
      if (this.mode === before && this.pending.length === pendingBefore) return;
    }
  }

  private step(): void {
    switch (this.mode) {
      case 'thinkStart':
        return this.thinkStart();
      case 'think':
        return this.think();
      case 'afterThink':
        return this.afterThink();
      case 'answerStart':
        return this.answerStart();
      case 'content':
        return this.scanContent();
      case 'calls':
        return this.scanCall();
      case 'afterCall':
        return this.afterCall();
    }
  }

  private thinkStart(): void {
    const { start } = this.options.reasoning!;
    const trimmed = this.pending.trimStart();
    if (trimmed.startsWith(start)) {
      this.pending = trimmed.slice(start.length);
      this.mode = 'think';
    } else if (!this.isFinal && start.startsWith(trimmed)) {
      return;
    } else {
      this.mode = 'answerStart';
    }
  }

  private think(): void {
    const { end } = this.options.reasoning!;
    const at = this.pending.indexOf(end);
    if (at !== -1) {
      this.emit({ kind: 'reasoning', text: this.pending.slice(0, at) });
      this.pending = this.pending.slice(at + end.length);
      this.mode = 'afterThink';
      return;
    }
    if (this.isFinal) return;
    const keep = partialTagLength(this.pending, end);
    this.emit({ kind: 'reasoning', text: this.pending.slice(0, this.pending.length - keep) });
    this.pending = this.pending.slice(this.pending.length - keep);
  }

  /** The blank lines a model writes after </think> separate, they are not the answer. */
  private afterThink(): void {
    this.pending = this.pending.replace(LEADING_SPACE, '');
    if (this.pending !== '' || this.isFinal) this.mode = 'answerStart';
  }

  private answerStart(): void {
    const syntax = this.options.toolCalls;
    if (syntax === null) {
      this.mode = 'content';
      return;
    }
    const trimmed = this.pending.trimStart();
    if (trimmed === '' && !this.isFinal) return;
    if (syntax.marker !== null && trimmed.startsWith(syntax.marker)) {
      this.openRegion(this.pending.length - trimmed.length + syntax.marker.length);
      return;
    }
    // Mistral's marker begins with its bare opening: wait until they differ.
    if (!this.isFinal && syntax.marker !== null && syntax.marker.startsWith(trimmed)) return;
    if (syntax.bareOpening !== null && trimmed.startsWith(syntax.bareOpening)) {
      this.openRegion(this.pending.length - trimmed.length);
      return;
    }
    this.mode = 'content';
  }

  private scanContent(): void {
    const marker = this.options.toolCalls?.marker ?? null;
    if (marker === null) {
      this.emit({ kind: 'content', text: this.pending });
      this.pending = '';
      return;
    }
    const at = this.pending.indexOf(marker);
    if (at !== -1) {
      // The blank lines a model writes around its calls are not content.
      this.emit({ kind: 'content', text: this.pending.slice(0, at).trimEnd() });
      this.pending = this.pending.slice(at);
      this.openRegion(marker.length);
      return;
    }
    if (this.isFinal) return;
    // Held back: what may become the marker, and blank space that may precede it.
    const keep = partialTagLength(this.pending, marker);
    const settled = this.pending.slice(0, this.pending.length - keep).trimEnd();
    this.emit({ kind: 'content', text: settled });
    this.pending = this.pending.slice(settled.length);
  }

  /** Calls begin after the first `length` characters of pending (a marker, blank space). */
  private openRegion(length: number): void {
    this.regionText = this.pending.slice(0, length);
    this.pending = this.pending.slice(length);
    this.isInArray = false;
    this.mode = 'calls';
  }

  private scanCall(): void {
    const syntax = this.options.toolCalls!;
    if (syntax.isArray && !this.isInArray) {
      const trimmed = this.pending.trimStart();
      if (trimmed === '') return;
      if (!trimmed.startsWith('[')) return this.notACall();
      this.regionText += this.pending.slice(0, this.pending.length - trimmed.length + 1);
      this.pending = trimmed.slice(1);
      this.isInArray = true;
    }
    this.scanner ??= new CallScanner();
    const taken = this.scanner.push(this.pending);
    const rest = this.pending.slice(taken);
    this.pending = '';
    if (this.scanner.isFailed) {
      this.regionText += this.scanner.text;
      this.scanner = null;
      return this.notACall();
    }
    this.announce();
    if (!this.scanner.isDone) return;
    const { name, text, end } = this.scanner;
    if (name === null) {
      this.regionText += text.slice(0, end);
      this.scanner = null;
      this.pending = rest;
      return this.notACall();
    }
    this.toolCalls.push({ id: this.announced!.id, name, arguments: this.scanner.argumentsSoFar });
    this.scanner = null;
    this.announced = null;
    this.regionText = '';
    this.pending = rest;
    this.mode = 'afterCall';
  }

  /** Once the name is known: the call's announcement, then whatever of its arguments is final. */
  private announce(): void {
    const scanner = this.scanner!;
    if (scanner.name === null) return;
    if (this.announced === null) {
      this.announced = { index: this.toolCalls.length, id: newCallId(), name: scanner.name };
      this.emit({ kind: 'call', ...this.announced });
      this.numArgumentChars = 0;
    }
    const soFar = scanner.argumentsSoFar;
    if (soFar.length > this.numArgumentChars) {
      this.emit({ kind: 'arguments', index: this.announced.index, text: soFar.slice(this.numArgumentChars) });
      this.numArgumentChars = soFar.length;
    }
  }

  /** The region was not a call after all: its text is content. */
  private notACall(): void {
    this.emit({ kind: 'content', text: this.regionText });
    this.regionText = '';
    this.isInArray = false;
    this.mode = 'content';
  }

  /** Between calls: hermes' end tag, a separator, the array's end, or text that ends the calls. */
  private afterCall(): void {
    const syntax = this.options.toolCalls!;
    const trimmed = this.pending.trimStart();
    if (trimmed === '' && !this.isFinal) return;
    const consume = (length: number, next: Mode) => {
      this.pending = trimmed.slice(length);
      this.mode = next;
    };
    if (syntax.closing !== null) {
      if (trimmed.startsWith(syntax.closing)) return consume(syntax.closing.length, 'content');
      // An end tag cut off with the output closes nothing more: it is not content either.
      if (syntax.closing.startsWith(trimmed)) return this.isFinal ? consume(trimmed.length, 'content') : undefined;
    }
    if (syntax.separator !== null && trimmed.startsWith(syntax.separator)) return consume(syntax.separator.length, 'calls');
    if (syntax.isArray && trimmed.startsWith(']')) {
      this.isInArray = false;
      return consume(1, 'content');
    }
    this.isInArray = false;
    this.mode = 'content';
  }
}

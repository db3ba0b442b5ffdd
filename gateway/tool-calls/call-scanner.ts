// Finds, as its text streams in, the parts of one tool call written as a JSON object
// ({"name": "f", "arguments": {...}}): the function's name, and the raw text of its arguments
// value, which streams out as it arrives. It tracks only the object's structure (strings, escapes
// and nesting, enough to know where each top-level value begins and ends); values are decoded by
// JSON.parse, and arguments are passed on exactly as the model wrote them, as OpenAI does.
// Boundaries come from the object's own structure, never from an end tag, so a "</tool_call>"
// inside an argument cannot end a call (vllm#45167).

type Expect = 'open' | 'key' | 'colon' | 'value' | 'inValue' | 'afterValue' | 'done' | 'failed';

const WHITESPACE = new Set([' ', '\t', '\n', '\r']);
const ARGUMENT_KEYS = new Set(['arguments', 'parameters']);

export class CallScanner {
  /** The object's text so far (from its opening brace, leading whitespace included). */
  text = '';
  private position = 0;
  private expect: Expect = 'open';
  private depth = 0;
  private inString = false;
  private isEscaped = false;
  private keyStart = -1;
  private key: string | null = null;
  private valueStart = -1;
  /** The end of the value's text so far, trailing whitespace excluded. */
  private valueEnd = -1;
  name: string | null = null;
  /** Where the arguments value starts in text, and where it ends once complete. */
  argumentsStart = -1;
  argumentsEnd = -1;

  /** Object complete: its closing brace has been read. */
  get isDone(): boolean {
    return this.expect === 'done';
  }

  /** Not an object: its first character was something else. */
  get isFailed(): boolean {
    return this.expect === 'failed';
  }

  /** Where the object ends in text (just past its closing brace), once done. */
  get end(): number {
    return this.position;
  }

  /** The arguments text known to be final so far ('' before the value starts). */
  get argumentsSoFar(): string {
    if (this.argumentsStart === -1) return '';
    if (this.argumentsEnd !== -1) return this.text.slice(this.argumentsStart, this.argumentsEnd);
    return this.key !== null && ARGUMENT_KEYS.has(this.key) && this.valueEnd > this.argumentsStart ? this.text.slice(this.argumentsStart, this.valueEnd) : '';
  }

  /** Feeds more text; returns how much of it was taken (all unless the object ended inside it). */
  push(chunk: string): number {
    const base = this.text.length;
    this.text += chunk;
    while (this.position < this.text.length && this.expect !== 'done' && this.expect !== 'failed') this.step(this.text[this.position++]);
    return this.isDone ? this.position - base : chunk.length;
  }

  private step(char: string): void {
    if (this.inString) {
      if (this.isEscaped) this.isEscaped = false;
      else if (char === '\\') this.isEscaped = true;
      else if (char === '"') this.closeString();
      if (this.expect === 'inValue') this.valueEnd = this.position;
      return;
    }
    switch (this.expect) {
      case 'open':
        if (WHITESPACE.has(char)) return;
        if (char !== '{') {
          this.expect = 'failed';
          return;
        }
        this.depth = 1;
        this.expect = 'key';
        return;
      case 'key':
        if (WHITESPACE.has(char)) return;
        if (char === '}') {
          this.expect = 'done';
          return;
        }
        if (char !== '"') {
          this.expect = 'failed';
          return;
        }
        this.keyStart = this.position - 1;
        this.inString = true;
        return;
      case 'colon':
        if (WHITESPACE.has(char)) return;
        this.expect = char === ':' ? 'value' : 'failed';
        return;
      case 'value':
        if (WHITESPACE.has(char)) return;
        this.valueStart = this.position - 1;
        if (this.key !== null && ARGUMENT_KEYS.has(this.key) && this.argumentsStart === -1) this.argumentsStart = this.valueStart;
        this.expect = 'inValue';
        this.takeValueChar(char);
        return;
      case 'inValue':
        this.takeValueChar(char);
        return;
      case 'afterValue':
        if (WHITESPACE.has(char)) return;
        if (char === ',') this.expect = 'key';
        else if (char === '}') this.expect = 'done';
        else this.expect = 'failed';
        return;
    }
  }

  /** A character of a top-level value: nested containers and strings, or a primitive until , or }. */
  private takeValueChar(char: string): void {
    if (this.depth === 1 && (char === ',' || char === '}')) {
      this.endValue();
      this.expect = char === ',' ? 'key' : 'done';
      return;
    }
    if (char === '"') this.inString = true;
    else if (char === '{' || char === '[') this.depth++;
    else if (char === '}' || char === ']') this.depth--;
    if (!WHITESPACE.has(char)) this.valueEnd = this.position;
    // A container or string back at the top level completes the value: what follows is , or }.
    if (this.depth === 1 && !this.inString && (char === '}' || char === ']')) this.endValue();
  }

  private closeString(): void {
    this.inString = false;
    if (this.expect === 'key') {
      this.key = JSON.parse(this.text.slice(this.keyStart, this.position)) as string;
      this.expect = 'colon';
    } else if (this.expect === 'inValue' && this.depth === 1) {
      this.valueEnd = this.position;
      this.endValue();
    }
  }

  private endValue(): void {
    const value = this.text.slice(this.valueStart, this.valueEnd);
    if (this.key === 'name' && this.name === null) {
      try {
        const name: unknown = JSON.parse(value);
        if (typeof name === 'string') this.name = name;
      } catch {
        // Not a string: a call without a name.
      }
    } else if (this.key !== null && ARGUMENT_KEYS.has(this.key) && this.argumentsEnd === -1 && this.valueStart === this.argumentsStart) {
      this.argumentsEnd = this.valueEnd;
    }
    this.expect = 'afterValue';
  }
}

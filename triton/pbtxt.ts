// Protocol buffers text format (what Triton's config.pbtxt is written in), parsed into plain
// JSON-like data. The format does not say which fields repeat or are maps, so the caller names
// them; every value's line is recorded by its dotted path ("input.0.dims") for error messages.

export class PbtxtError extends Error {
  override name = 'PbtxtError';
  constructor(readonly line: number, message: string) {
    super(message);
  }
}

export interface PbtxtShape {
  /** Fields that may appear more than once (or as `[a, b]` lists); they become arrays. */
  repeatedFields: ReadonlySet<string>;
  /** Map fields, written as repeated `{ key: .. value: .. }` entries; they become objects. */
  mapFields: ReadonlySet<string>;
}

export interface ParsedPbtxt {
  value: Record<string, unknown>;
  /** Line of each field and element, by dotted path. */
  lines: Map<string, number>;
}

type Token =
  | { kind: 'ident' | 'number'; text: string; line: number }
  | { kind: 'string'; text: string; line: number }
  | { kind: 'punct'; text: string; line: number };

const ESCAPES: Record<string, string> = { n: '\n', t: '\t', r: '\r', '"': '"', "'": "'", '\\': '\\', '0': '\0' };

function tokenize(text: string): Token[] {
  const tokens: Token[] = [];
  let line = 1;
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === '\n') { line++; i++; continue; }
    if (ch === ' ' || ch === '\t' || ch === '\r') { i++; continue; }
    if (ch === '#') { while (i < text.length && text[i] !== '\n') i++; continue; }
    if ('{}[]<>:,;'.includes(ch)) { tokens.push({ kind: 'punct', text: ch, line }); i++; continue; }
    if (ch === '"' || ch === "'") {
      let value = '';
      const startLine = line;
      i++;
      while (i < text.length && text[i] !== ch) {
        if (text[i] === '\n') throw new PbtxtError(startLine, 'unterminated string');
        if (text[i] === '\\') {
          const escaped = ESCAPES[text[i + 1]];
          if (escaped === undefined) throw new PbtxtError(line, `unknown escape \\${text[i + 1]}`);
          value += escaped;
          i += 2;
        } else {
          value += text[i++];
        }
      }
      if (i >= text.length) throw new PbtxtError(startLine, 'unterminated string');
      i++;
      // Adjacent strings concatenate, as in C.
      const previous = tokens.at(-1);
      if (previous?.kind === 'string' && previous.line === startLine) previous.text += value;
      else tokens.push({ kind: 'string', text: value, line: startLine });
      continue;
    }
    const match = /^(-?(?:0x[0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[fF]?|-?(?:inf|infinity|nan)\b|[A-Za-z_][A-Za-z0-9_.]*)/i.exec(text.slice(i));
    if (match === null) throw new PbtxtError(line, `unexpected character ${JSON.stringify(ch)}`);
    const word = match[0];
    const isNumber = /^-?[0-9.]/.test(word) || /^-(inf|nan)/i.test(word);
    tokens.push({ kind: isNumber ? 'number' : 'ident', text: word, line });
    i += word.length;
  }
  return tokens;
}

function scalarOf(token: Token): unknown {
  if (token.kind === 'string') return token.text;
  if (token.kind === 'number') {
    const text = token.text.replace(/[fF]$/, '');
    if (/^-?0x/i.test(text)) return (text.startsWith('-') ? -1 : 1) * parseInt(text.replace('-', ''), 16);
    if (/^-?inf/i.test(text)) return text.startsWith('-') ? -Infinity : Infinity;
    if (/nan/i.test(text)) return NaN;
    return Number(text);
  }
  if (token.kind === 'ident') {
    if (token.text === 'true' || token.text === 'True' || token.text === 't') return true;
    if (token.text === 'false' || token.text === 'False' || token.text === 'f') return false;
    return token.text;
  }
  throw new PbtxtError(token.line, `expected a value, found ${JSON.stringify(token.text)}`);
}

class Parser {
  private pos = 0;
  readonly lines = new Map<string, number>();

  constructor(private readonly tokens: Token[], private readonly shape: PbtxtShape) {}

  private peek(): Token | undefined {
    return this.tokens[this.pos];
  }

  private next(expected: string): Token {
    const token = this.tokens[this.pos++];
    if (token === undefined) {
      throw new PbtxtError(this.tokens.at(-1)?.line ?? 1, `unexpected end of file, expected ${expected}`);
    }
    return token;
  }

  private isPunct(text: string): boolean {
    const token = this.peek();
    return token?.kind === 'punct' && token.text === text;
  }

  /** Fields until `close` (or the end of the file when close is null). */
  parseMessage(close: string | null, path: string): Record<string, unknown> {
    const message: Record<string, unknown> = {};
    const entries = new Map<string, unknown[]>();
    for (;;) {
      const token = this.peek();
      if (token === undefined) {
        if (close !== null) throw new PbtxtError(this.tokens.at(-1)?.line ?? 1, `unexpected end of file, expected "${close}"`);
        break;
      }
      if (token.kind === 'punct' && token.text === close) { this.pos++; break; }
      if (token.kind === 'punct' && (token.text === ',' || token.text === ';')) { this.pos++; continue; }
      const name = this.next('a field name');
      if (name.kind !== 'ident') throw new PbtxtError(name.line, `expected a field name, found ${JSON.stringify(name.text)}`);
      const field = name.text;
      const fieldPath = path === '' ? field : `${path}.${field}`;
      const values = entries.get(field) ?? [];
      entries.set(field, values);
      const hasColon = this.isPunct(':');
      if (hasColon) this.pos++;
      if (this.isPunct('[')) {
        this.pos++;
        while (!this.isPunct(']')) {
          values.push(this.parseValue(fieldPath, values.length, name.line));
          if (this.isPunct(',')) this.pos++;
          else if (!this.isPunct(']')) throw new PbtxtError(this.next('"]"').line, `expected "," or "]" in the list of ${field}`);
        }
        this.pos++;
      } else {
        if (!hasColon && !this.isPunct('{') && !this.isPunct('<')) {
          throw new PbtxtError(name.line, `expected ":" or "{" after ${field}`);
        }
        values.push(this.parseValue(fieldPath, values.length, name.line));
      }
      if (!this.lines.has(fieldPath)) this.lines.set(fieldPath, name.line);
    }
    for (const [field, values] of entries) {
      const fieldPath = path === '' ? field : `${path}.${field}`;
      if (this.shape.mapFields.has(field)) {
        message[field] = this.toMap(fieldPath, values);
      } else if (this.shape.repeatedFields.has(field)) {
        message[field] = values;
      } else {
        if (values.length > 1) throw new PbtxtError(this.lines.get(`${fieldPath}#1`) ?? this.lines.get(fieldPath)!, `${fieldPath} is set more than once`);
        this.renumber(fieldPath);
        message[field] = values[0];
      }
    }
    return message;
  }

  /** A value's path is recorded as `field#i` while parsing; an unrepeated field drops the index. */
  private renumber(fieldPath: string): void {
    const prefix = `${fieldPath}#0`;
    for (const [key, line] of [...this.lines]) {
      if (key === prefix || key.startsWith(`${prefix}.`)) {
        this.lines.delete(key);
        this.lines.set(fieldPath + key.slice(prefix.length), line);
      }
    }
  }

  private toMap(fieldPath: string, values: unknown[]): Record<string, unknown> {
    const map: Record<string, unknown> = {};
    values.forEach((entry, i) => {
      const line = this.lines.get(`${fieldPath}#${i}`) ?? 1;
      if (typeof entry !== 'object' || entry === null || !('key' in entry)) throw new PbtxtError(line, `${fieldPath}: a map entry needs a key`);
      const { key, value } = entry as { key: unknown; value?: unknown };
      map[String(key)] = value;
      for (const [k, l] of [...this.lines]) {
        const prefix = `${fieldPath}#${i}`;
        if (k === prefix || k.startsWith(`${prefix}.`)) {
          this.lines.delete(k);
          const rest = k.slice(prefix.length).replace(/^\.value/, '');
          if (!rest.startsWith('.key')) this.lines.set(`${fieldPath}.${String(key)}${rest}`, l);
        }
      }
    });
    return map;
  }

  private parseValue(fieldPath: string, index: number, line: number): unknown {
    const elementPath = this.shape.repeatedFields.has(fieldPath.split('.').at(-1)!) ? `${fieldPath}.${index}` : `${fieldPath}#${index}`;
    const token = this.next('a value');
    this.lines.set(elementPath, token.line ?? line);
    if (token.kind === 'punct' && (token.text === '{' || token.text === '<')) {
      return this.parseMessage(token.text === '{' ? '}' : '>', elementPath);
    }
    return scalarOf(token);
  }
}

export function parsePbtxt(text: string, shape: PbtxtShape): ParsedPbtxt {
  const parser = new Parser(tokenize(text), shape);
  const value = parser.parseMessage(null, '');
  return { value, lines: parser.lines };
}

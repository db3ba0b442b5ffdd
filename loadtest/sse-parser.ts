// Incremental Server-Sent Events parser (the subset LLM servers use: `event:` and `data:`
// fields, `:` comments, LF or CRLF line ends). Text may arrive split anywhere.

export type SseEventHandler = (eventName: string, data: string) => void;

export class SseParser {
  private pendingLine = '';
  private eventName = '';
  private data: string | null = null;

  constructor(private readonly onEvent: SseEventHandler) {}

  push(text: string): void {
    const input = this.pendingLine === '' ? text : this.pendingLine + text;
    let lineStart = 0;
    let newline = input.indexOf('\n', lineStart);
    while (newline !== -1) {
      const lineEnd = newline > lineStart && input.charCodeAt(newline - 1) === 13 ? newline - 1 : newline;
      this.processLine(input, lineStart, lineEnd);
      lineStart = newline + 1;
      newline = input.indexOf('\n', lineStart);
    }
    this.pendingLine = lineStart === input.length ? '' : input.slice(lineStart);
  }

  private processLine(input: string, start: number, end: number): void {
    if (start === end) {
      if (this.data !== null) this.onEvent(this.eventName || 'message', this.data);
      this.eventName = '';
      this.data = null;
      return;
    }
    if (input.startsWith('data:', start)) {
      const value = input.slice(start + (input.charCodeAt(start + 5) === 32 ? 6 : 5), end);
      this.data = this.data === null ? value : this.data + '\n' + value;
    } else if (input.startsWith('event:', start)) {
      this.eventName = input.slice(start + (input.charCodeAt(start + 6) === 32 ? 7 : 6), end);
    }
  }
}

// Finds stop strings in streamed text. Text that could still grow into a stop string is held
// back, so a stop string split across deltas never reaches the client.

export interface StopMatch {
  /** Safe to send. */
  text: string;
  /** The stop string that ended generation, or null. */
  stop: string | null;
}

export class StopMatcher {
  private readonly stops: readonly string[];
  private held = '';

  constructor(stops: readonly string[]) {
    this.stops = stops.filter((stop) => stop.length > 0);
  }

  /** After a match, the text up to the stop string is returned and the rest is dropped. */
  push(delta: string): StopMatch {
    if (this.stops.length === 0) return { text: delta, stop: null };
    const buffer = this.held + delta;
    // The stop that completes first in the text wins (ties: the longer one), so the outcome
    // does not depend on how the text was split into deltas.
    let matchIndex = -1;
    let matchEnd = Infinity;
    let matchedStop: string | null = null;
    for (const stop of this.stops) {
      const index = buffer.indexOf(stop);
      if (index === -1) continue;
      const end = index + stop.length;
      if (end < matchEnd || (end === matchEnd && index < matchIndex)) {
        matchIndex = index;
        matchEnd = end;
        matchedStop = stop;
      }
    }
    if (matchedStop !== null) {
      this.held = '';
      return { text: buffer.slice(0, matchIndex), stop: matchedStop };
    }
    const numHeldChars = this.longestPartialMatch(buffer);
    this.held = buffer.slice(buffer.length - numHeldChars);
    return { text: buffer.slice(0, buffer.length - numHeldChars), stop: null };
  }

  /** Generation ended without a match: what was held back is plain text. */
  flush(): string {
    const text = this.held;
    this.held = '';
    return text;
  }

  /** Length of the longest suffix of buffer that is a proper prefix of some stop string. */
  private longestPartialMatch(buffer: string): number {
    let longest = 0;
    for (const stop of this.stops) {
      for (let length = Math.min(stop.length - 1, buffer.length); length > longest; length--) {
        if (buffer.endsWith(stop.slice(0, length))) {
          longest = length;
          break;
        }
      }
    }
    return longest;
  }
}

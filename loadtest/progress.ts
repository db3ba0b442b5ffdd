// A progress bar on stderr while a load point runs; on a non-terminal (CI logs) a line per
// tenth of the way instead of a redrawn bar.

import { performance } from 'node:perf_hooks';

export interface ProgressReporter {
  start(title: string, numRequests: number): void;
  requestDone(failed: boolean): void;
  finish(): void;
}

const BAR_WIDTH = 30;
const REDRAW_INTERVAL_MS = 100;

export class StderrProgress implements ProgressReporter {
  private title = '';
  private numRequests = 0;
  private numDone = 0;
  private numFailed = 0;
  private startMs = 0;
  private lastDrawMs = 0;
  private lastTenth = 0;
  private readonly isTerminal = process.stderr.isTTY === true;

  start(title: string, numRequests: number): void {
    this.title = title;
    this.numRequests = numRequests;
    this.numDone = 0;
    this.numFailed = 0;
    this.lastTenth = 0;
    this.startMs = performance.now();
    this.lastDrawMs = 0;
    if (this.isTerminal) this.draw();
    else process.stderr.write(`${title}: ${numRequests} requests\n`);
  }

  requestDone(failed: boolean): void {
    this.numDone++;
    if (failed) this.numFailed++;
    if (this.isTerminal) {
      const nowMs = performance.now();
      if (nowMs - this.lastDrawMs >= REDRAW_INTERVAL_MS) this.draw();
      return;
    }
    const tenth = Math.floor((this.numDone * 10) / this.numRequests);
    if (tenth > this.lastTenth) {
      this.lastTenth = tenth;
      process.stderr.write(`  ${this.statusLine()}\n`);
    }
  }

  finish(): void {
    if (this.isTerminal) {
      this.draw();
      process.stderr.write('\n');
    }
  }

  private statusLine(): string {
    const elapsedS = (performance.now() - this.startMs) / 1000;
    const rate = elapsedS > 0 ? this.numDone / elapsedS : 0;
    return `${this.numDone}/${this.numRequests} requests, ${this.numFailed} failed, ${rate.toFixed(1)} req/s, ${elapsedS.toFixed(1)} s`;
  }

  private draw(): void {
    this.lastDrawMs = performance.now();
    const filled = this.numRequests === 0 ? BAR_WIDTH : Math.round((this.numDone / this.numRequests) * BAR_WIDTH);
    const bar = '#'.repeat(filled) + '.'.repeat(BAR_WIDTH - filled);
    process.stderr.write(`\r${this.title} [${bar}] ${this.statusLine()}\x1b[K`);
  }
}

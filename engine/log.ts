// The worker's log: JSON lines on stdout (pino), in the gateway's format (an ISO time, the
// level's name). A line about a request names it by the gateway's request id, never its tokens.
import { pino, type DestinationStream, type LevelWithSilent, type Logger } from 'pino';

export type { Logger };

export function createWorkerLogger(level: LevelWithSilent, stream?: DestinationStream): Logger {
  const options = {
    level,
    base: { pid: process.pid, role: 'worker' },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
  };
  return stream === undefined ? pino(options) : pino(options, stream);
}

/** For engines served without a log (tests, tools). */
export const silentLogger: Logger = pino({ level: 'silent' });

// Triton's logging extension over the gateway's logger (pino, through fastify's `app.log`): the
// settings are mapped onto the logger's level, which new request loggers inherit. pino filters
// by one threshold, so the enabled severities must be a contiguous run from error down:
// verbose ⊂ info ⊂ warning ⊂ error; a combination a threshold cannot express is refused rather
// than half applied. As in Triton, the log file cannot be changed over the network, and the
// format is the server's own (JSON lines), reported as "default".
import { ClassicError } from '../../triton/index.ts';

/** What the settings need of a logger: pino's and fastify's both have a writable `level`. */
export interface LevelledLogger {
  level: string;
}

export interface LogSettingsState {
  log_file: string;
  log_info: boolean;
  log_warning: boolean;
  log_error: boolean;
  log_verbose_level: number;
  log_format: string;
}

/** A change as the wire gives it (HTTP JSON values; gRPC's oneof read into the same types). */
export type LogSettingChanges = Record<string, unknown>;

const UINT32_MAX = 0xffffffff;

function stateOfLevel(level: string | undefined): LogSettingsState {
  const rank = ['trace', 'debug', 'info', 'warn', 'error'].indexOf(level ?? 'silent');
  const on = (threshold: number) => rank !== -1 && rank <= threshold;
  return {
    log_file: '', log_info: on(2), log_warning: on(3), log_error: on(4), log_verbose_level: on(0) ? 2 : on(1) ? 1 : 0, log_format: 'default',
  };
}

function levelOf(state: LogSettingsState): string {
  const order: Array<[boolean, string, string]> = [
    [state.log_verbose_level > 0, 'log_verbose_level > 0', state.log_verbose_level >= 2 ? 'trace' : 'debug'],
    [state.log_info, 'log_info', 'info'],
    [state.log_warning, 'log_warning', 'warn'],
    [state.log_error, 'log_error', 'error'],
  ];
  const lowest = order.findIndex(([enabled]) => enabled);
  if (lowest === -1) return 'silent';
  const gap = order.slice(lowest + 1).find(([enabled]) => !enabled);
  if (gap !== undefined) {
    throw new ClassicError('UNSUPPORTED', `${order[lowest][1]} needs ${gap[1]} on too: Conduit's logger keeps every severity above the lowest it logs`);
  }
  return order[lowest][2];
}

export class LogSettings {
  /** Until a logger is attached nothing is logged, and the settings say so. */
  private state = stateOfLevel(undefined);
  private readonly loggers: LevelledLogger[] = [];

  /** A logger to keep at the settings' level: the first one's level at start is what the settings first report. */
  attach(logger: LevelledLogger): void {
    if (this.loggers.length === 0) this.state = stateOfLevel(logger.level);
    else logger.level = levelOf(this.state);
    this.loggers.push(logger);
  }

  get(): LogSettingsState {
    return { ...this.state };
  }

  /** Applies every change or none, and returns the settings after. */
  update(changes: LogSettingChanges): LogSettingsState {
    const next = { ...this.state };
    for (const [name, value] of Object.entries(changes)) {
      switch (name) {
        case 'log_file':
          throw new ClassicError('UNSUPPORTED', 'log file location can not be updated through network protocol');
        case 'log_info': case 'log_warning': case 'log_error':
          if (typeof value !== 'boolean') throw new ClassicError('INVALID_ARG', `expect boolean for '${name}'`);
          next[name] = value;
          break;
        case 'log_verbose_level':
          if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > UINT32_MAX) {
            throw new ClassicError('INVALID_ARG', `expect unsigned integer for '${name}'`);
          }
          next.log_verbose_level = value;
          break;
        case 'log_format':
          if (typeof value !== 'string') throw new ClassicError('INVALID_ARG', `expect string for '${name}'`);
          if (value === 'ISO8601') throw new ClassicError('UNSUPPORTED', "log_format 'ISO8601' is not available: Conduit logs JSON lines with epoch-millisecond times");
          if (value !== 'default') throw new ClassicError('INVALID_ARG', `invalid argument for log_format, got: ${value}`);
          break;
        default:
          throw new ClassicError('INVALID_ARG', `unknown log setting '${name}'`);
      }
    }
    const level = levelOf(next);
    this.state = next;
    for (const logger of this.loggers) logger.level = level;
    return this.get();
  }
}

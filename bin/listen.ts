// Binds one of the server's ports, and turns a failure into one line a user can act on: which
// address, which setting or flag chose it, and why (`address already in use`), with no stack.
import { FatalError } from './fatal-error.ts';

const reasonsByCode: Record<string, string> = {
  EADDRINUSE: 'address already in use',
  EACCES: 'permission denied (ports below 1024 need privileges)',
  EADDRNOTAVAIL: 'no such address on this machine',
};

function reasonOf(err: unknown): string {
  const { code, message } = err as NodeJS.ErrnoException;
  if (code !== undefined && code in reasonsByCode) return reasonsByCode[code];
  // gRPC reports the system's error code inside its message.
  const named = Object.keys(reasonsByCode).find((name) => message?.includes(name));
  return named === undefined ? message : reasonsByCode[named];
}

/** setting: what chose the port, e.g. `server.http_port / --http-port`. */
export async function listenOrExplain<T>(host: string, port: number, setting: string, bind: (port: number) => Promise<T>): Promise<T> {
  try {
    return await bind(port);
  } catch (err) {
    throw new FatalError(`cannot listen on ${host}:${port} (${setting}): ${reasonOf(err)}`);
  }
}

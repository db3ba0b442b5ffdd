// A raw TCP client for what fetch hides: bytes sent slowly, a reader that stops reading, a
// connection's close.
import { once } from 'node:events';
import net from 'node:net';

export interface RawConnection {
  socket: net.Socket;
  /** Everything received so far. */
  received(): Buffer;
  /** Resolves once the server has closed the connection (or reset it). */
  closed: Promise<void>;
}

export async function connect(baseUrl: string): Promise<RawConnection> {
  const { hostname, port } = new URL(baseUrl);
  const socket = net.connect(Number(port), hostname);
  const chunks: Buffer[] = [];
  socket.on('data', (chunk: Buffer) => chunks.push(chunk));
  const closed = new Promise<void>((resolve) => {
    socket.once('close', () => resolve());
    // A reset arrives as an error before the close.
    socket.on('error', () => {});
  });
  await once(socket, 'connect');
  return { socket, received: () => Buffer.concat(chunks), closed };
}

/** A POST's head; the body is sent separately so it can be dripped. closes: the server closes the connection after answering. */
export function postHead(route: string, numBodyBytes: number, closes = false): string {
  const connection = closes ? 'Connection: close\r\n' : '';
  return `POST ${route} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${numBodyBytes}\r\n${connection}\r\n`;
}

/** The status code and body of one complete HTTP/1.1 response (Content-Length or chunked). */
export function parseResponse(bytes: Buffer): { status: number; body: string } {
  const headEnd = bytes.indexOf('\r\n\r\n');
  if (headEnd === -1) throw new Error(`no complete response head in ${JSON.stringify(bytes.toString('utf8'))}`);
  const head = bytes.subarray(0, headEnd).toString('latin1');
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]);
  let body = bytes.subarray(headEnd + 4);
  if (/^transfer-encoding: chunked$/im.test(head)) {
    const pieces: Buffer[] = [];
    for (let offset = 0; ; ) {
      const lineEnd = body.indexOf('\r\n', offset);
      const size = parseInt(body.subarray(offset, lineEnd).toString('latin1'), 16);
      if (size === 0) break;
      pieces.push(body.subarray(lineEnd + 2, lineEnd + 2 + size));
      offset = lineEnd + 2 + size + 2;
    }
    body = Buffer.concat(pieces);
  }
  return { status, body: body.toString('utf8') };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

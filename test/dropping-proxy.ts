// A TCP hop in front of a server (a real redis-server in the Redis tests) that drops its
// connections the way a network does: it ends its side toward each client (a FIN) and goes on
// reading what the client still sends, so the client sees an orderly end, never a reset. While
// held, new connections are accepted but not forwarded, so a client's reconnect hangs until
// release(): whatever it sends meanwhile waits in its socket.
import net from 'node:net';

export interface DroppingProxy {
  /** redis://HOST:PORT of the proxy. */
  readonly url: string;
  /** Ends every connection now; with `hold`, forwards none of the next ones until release(). */
  drop(options?: { hold?: boolean }): void;
  release(): void;
  close(): Promise<void>;
}

export async function startDroppingProxy(targetPort: number): Promise<DroppingProxy> {
  /** Each client with its connection upstream, once forwarded. */
  const clients = new Map<net.Socket, net.Socket | null>();
  const held: net.Socket[] = [];
  let isHolding = false;
  const forward = (client: net.Socket) => {
    const upstream = net.connect(targetPort, '127.0.0.1');
    upstream.on('error', () => {});
    client.pipe(upstream).pipe(client);
    client.on('close', () => upstream.destroy());
    clients.set(client, upstream);
  };
  const server = net.createServer((client) => {
    client.on('error', () => {});
    clients.set(client, null);
    client.on('close', () => clients.delete(client));
    if (isHolding) held.push(client);
    else forward(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `redis://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    drop(options = {}) {
      isHolding = options.hold ?? false;
      for (const [client, upstream] of clients) {
        client.unpipe();
        upstream?.unpipe();
        upstream?.destroy();
        client.on('data', () => {});
        client.end();
      }
    },
    release() {
      isHolding = false;
      for (const client of held.splice(0)) if (!client.destroyed) forward(client);
    },
    close: () => new Promise((resolve) => {
      for (const [client, upstream] of clients) {
        client.destroy();
        upstream?.destroy();
      }
      server.close(() => resolve());
    }),
  };
}

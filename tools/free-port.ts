// A free loopback TCP port, for the servers benchmarks and tests start (the OS picks; it is
// released again at once, so a port can in rare cases be taken before the caller binds it).
import { once } from 'node:events';
import net from 'node:net';

export async function freePort(): Promise<number> {
  const server = net.createServer().listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as net.AddressInfo;
  server.close();
  await once(server, 'close');
  return port;
}

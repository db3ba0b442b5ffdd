// An error that ends `conduit serve` with one line and exit code 1, no stack: its message says
// all a user needs (which port, which setting, which worker).
export class FatalError extends Error {
  override name = 'FatalError';
}

// Triton's system shared-memory extension: a client creates a POSIX shared-memory object
// (shm_open, which on Linux is the file /dev/shm/<key>), registers a region of it by name, then
// names the region in an input's or a requested output's parameters instead of sending bytes.
// The server reads and writes the region through the same file (pread / pwrite on a descriptor
// held open while the region is registered): these are the pages the client's mmap sees. The
// copies are memcpy-sized and synchronous, like the JSON and binary decoders.
import { closeSync, constants, fstatSync, openSync, readSync, writeSync } from 'node:fs';
import path from 'node:path';
import { ClassicError, fromRaw, rawByteLength, toRaw, type DataType, type Tensor } from '../../triton/index.ts';

/** Where POSIX shared-memory objects live on Linux (glibc's shm_open). */
export const SHM_DIR = '/dev/shm';

export interface RegionStatus {
  name: string;
  key: string;
  offset: number;
  byte_size: number;
}

/** Where one tensor lives in a region: Triton's shared_memory_region / _offset / _byte_size. */
export interface SharedMemoryRef {
  region: string;
  offset: number;
  byteSize: number;
}

interface Region extends RegionStatus {
  fd: number;
  /** Requests holding the region; an unregistered region closes when the last lets go. */
  numLeases: number;
  unregistered: boolean;
}

/** A request's hold on a part of a region: it stays open until released, even if unregistered meanwhile. */
export interface SharedMemoryLease {
  readonly byteSize: number;
  read(): Uint8Array;
  write(bytes: Uint8Array): void;
  release(): void;
}

const invalid = (message: string) => new ClassicError('INVALID_ARG', message);

/** What decoding a request needs of shared memory: a hold on part of a region. */
export interface SharedMemoryAccess {
  lease(ref: SharedMemoryRef): SharedMemoryLease;
}

/** For a caller who may not use shared memory: any request naming a region is answered with error. */
export function refusedSharedMemory(error: Error): SharedMemoryAccess {
  return {
    lease() {
      throw error;
    },
  };
}

/** A key names an object directly under /dev/shm: an optional leading '/', then one path component. */
function pathOfKey(key: string): string {
  const name = key.startsWith('/') ? key.slice(1) : key;
  if (name === '' || name === '.' || name === '..' || name.includes('/') || name.includes('\0')) {
    throw invalid(`invalid shared memory key '${key}': it must name one object under ${SHM_DIR} (like '/my_region')`);
  }
  return path.join(SHM_DIR, name);
}

function nonNegativeInteger(value: unknown, what: string): number {
  const number = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
  if (typeof number !== 'number' || !Number.isSafeInteger(number) || number < 0) throw invalid(`'${what}' must be a non-negative integer`);
  return number;
}

export class SystemSharedMemory implements SharedMemoryAccess {
  private readonly regions = new Map<string, Region>();

  register(name: string, key: string, offsetValue: unknown, byteSizeValue: unknown): void {
    if (name === '') throw invalid('a shared memory region needs a name');
    if (typeof key !== 'string') throw invalid("'key' must be a string");
    const offset = nonNegativeInteger(offsetValue ?? 0, 'offset');
    const byteSize = nonNegativeInteger(byteSizeValue, 'byte_size');
    const file = pathOfKey(key);
    if (this.regions.has(name)) throw new ClassicError('ALREADY_EXISTS', `shared memory region '${name}' already in manager`);
    let fd: number;
    try {
      // O_NOFOLLOW: a key names the object itself, never a link out of /dev/shm.
      fd = openSync(file, constants.O_RDWR | constants.O_NOFOLLOW);
    } catch {
      // Triton's message; but a key naming no object (or a link) is the client's mistake, not the server's: 400, not Triton's 500.
      throw invalid(`Unable to open shared memory region: '${key}'`);
    }
    try {
      const stat = fstatSync(fd);
      if (!stat.isFile()) throw new ClassicError('INTERNAL', `Invalid shared memory region: '${key}'`);
      if (offset + byteSize > stat.size) throw invalid(`failed to register shared memory region '${name}': invalid args`);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
    this.regions.set(name, { name, key, offset, byte_size: byteSize, fd, numLeases: 0, unregistered: false });
  }

  /** Every region, or the one named (NOT_FOUND when it is not registered). */
  status(name: string | null): RegionStatus[] {
    const statusOf = ({ name, key, offset, byte_size }: Region): RegionStatus => ({ name, key, offset, byte_size });
    if (name === null) return [...this.regions.values()].map(statusOf);
    const region = this.regions.get(name);
    if (region === undefined) throw new ClassicError('NOT_FOUND', `Unable to find system shared memory region: '${name}'`);
    return [statusOf(region)];
  }

  /** Unregisters the region named, or every region; an unknown name is not an error (as in Triton). */
  unregister(name: string | null): void {
    const names = name === null ? [...this.regions.keys()] : [name];
    for (const regionName of names) {
      const region = this.regions.get(regionName);
      if (region === undefined) continue;
      this.regions.delete(regionName);
      region.unregistered = true;
      if (region.numLeases === 0) closeSync(region.fd);
    }
  }

  /** Holds `ref` of its region for a request, checking it lies inside the region. */
  lease(ref: SharedMemoryRef): SharedMemoryLease {
    const region = this.regions.get(ref.region);
    if (region === undefined) throw new ClassicError('NOT_FOUND', `Unable to find shared memory region: '${ref.region}'`);
    if (ref.offset >= region.byte_size && !(ref.offset === 0 && region.byte_size === 0)) {
      throw invalid(`Invalid offset for shared memory region: '${ref.region}'`);
    }
    if (ref.offset + ref.byteSize > region.byte_size) throw invalid(`Invalid offset + byte size for shared memory region: '${ref.region}'`);
    region.numLeases++;
    const position = region.offset + ref.offset;
    let released = false;
    // The client owns the object and may shrink it at any time: the bytes asked for must still be there.
    const checkInObject = (numBytes: number) => {
      const objectBytes = fstatSync(region.fd).size;
      if (position + numBytes <= objectBytes) return;
      throw invalid(`shared memory region '${ref.region}' runs past the end of its object ('${region.key}', now ${objectBytes} bytes): it was truncated after it was registered`);
    };
    return {
      byteSize: ref.byteSize,
      read() {
        checkInObject(ref.byteSize);
        const bytes = new Uint8Array(ref.byteSize);
        let numRead = 0;
        while (numRead < bytes.byteLength) {
          const n = readSync(region.fd, bytes, numRead, bytes.byteLength - numRead, position + numRead);
          if (n === 0) checkInObject(ref.byteSize);
          numRead += n;
        }
        return bytes;
      },
      write(bytes: Uint8Array) {
        // Writing past the end would grow the client's object back, silently.
        checkInObject(bytes.byteLength);
        let numWritten = 0;
        while (numWritten < bytes.byteLength) {
          numWritten += writeSync(region.fd, bytes, numWritten, bytes.byteLength - numWritten, position + numWritten);
        }
      },
      release() {
        if (released) return;
        released = true;
        if (--region.numLeases === 0 && region.unregistered) closeSync(region.fd);
      },
    };
  }

  close(): void {
    this.unregister(null);
  }
}

/** Reads Triton's three shared-memory parameters off an input's or output's parameters; null when absent. */
export function sharedMemoryRefOf(parameters: Record<string, unknown> | undefined, what: string): SharedMemoryRef | null {
  const region = parameters?.shared_memory_region;
  const byteSize = parameters?.shared_memory_byte_size;
  const offset = parameters?.shared_memory_offset;
  if (region === undefined && byteSize === undefined) {
    if (offset !== undefined) throw invalid(`${what}: 'shared_memory_offset' without 'shared_memory_region'`);
    return null;
  }
  if (region === undefined || byteSize === undefined) {
    throw invalid(`${what}: 'shared_memory_region' and 'shared_memory_byte_size' must be given together`);
  }
  if (typeof region !== 'string' || region === '') throw invalid(`${what}: 'shared_memory_region' must be a region name`);
  return {
    region,
    offset: nonNegativeInteger(offset ?? 0, 'shared_memory_offset'),
    byteSize: nonNegativeInteger(byteSize, 'shared_memory_byte_size'),
  };
}

/** An input's tensor read out of its region; the region's bytes are Triton's raw layout. */
export function readSharedMemoryInput(memory: SharedMemoryAccess, ref: SharedMemoryRef, datatype: DataType, shape: number[], what: string): Tensor {
  const lease = memory.lease(ref);
  try {
    return fromRaw(datatype, shape, lease.read(), what);
  } finally {
    lease.release();
  }
}

/** Writes an output into the region its request named; the region must hold all of it. */
export function writeSharedMemoryOutput(lease: SharedMemoryLease, tensor: Tensor, name: string): void {
  const numBytes = rawByteLength(tensor);
  if (numBytes > lease.byteSize) {
    throw invalid(`shared memory size specified with the request for output '${name}' (${lease.byteSize} bytes) should be at least ${numBytes} bytes to hold the results`);
  }
  lease.write(toRaw(tensor));
}

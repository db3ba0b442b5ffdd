// Triton's response cache (the `local` cache): one server-wide byte budget, models opting in with
// `response_cache { enable: true }`. A request's key hashes the model name, its version, the
// requested outputs and every input's name, datatype, shape and bytes; a hit answers with the
// outputs a previous request produced, without queueing or executing. Least recently used
// entries are evicted to stay within the budget; a result larger than the whole budget is not
// kept. A version's entries leave with it, so a reload never answers from the old weights.
import { createHash } from 'node:crypto';
import type { TensorMap } from './backend.ts';
import { rawByteLength, type FixedData, type Tensor } from './tensor.ts';

interface Entry {
  outputs: TensorMap;
  numBytes: number;
  owner: object;
}

function hashTensor(hash: ReturnType<typeof createHash>, name: string, tensor: Tensor) {
  hash.update(`${name}\0${tensor.datatype}\0${tensor.shape.join(',')}\0`);
  if (tensor.datatype !== 'BYTES') {
    const data = tensor.data as FixedData;
    hash.update(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
    return;
  }
  const length = Buffer.alloc(4);
  for (const element of tensor.data as Uint8Array[]) {
    length.writeUInt32LE(element.byteLength);
    hash.update(length);
    hash.update(element);
  }
}

export class ResponseCache {
  private readonly entries = new Map<string, Entry>();
  private numBytes = 0;

  constructor(readonly capacityBytes: number) {}

  get numEntries(): number {
    return this.entries.size;
  }

  keyOf(modelName: string, version: number, inputs: TensorMap, requestedOutputs: readonly string[] | null): string {
    const hash = createHash('sha256');
    hash.update(`${modelName}\0${version}\0${requestedOutputs === null ? '*' : requestedOutputs.join(',')}\0`);
    for (const name of Object.keys(inputs).sort()) hashTensor(hash, name, inputs[name]);
    return hash.digest('base64');
  }

  /** The cached outputs, now the most recently used; undefined on a miss. */
  lookup(key: string): TensorMap | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    this.entries.delete(key);
    this.entries.set(key, entry);
    return entry.outputs;
  }

  insert(key: string, outputs: TensorMap, owner: object): void {
    let numBytes = key.length;
    for (const tensor of Object.values(outputs)) numBytes += rawByteLength(tensor);
    if (numBytes > this.capacityBytes || this.entries.has(key)) return;
    for (const [oldKey, entry] of this.entries) {
      if (this.numBytes + numBytes <= this.capacityBytes) break;
      this.entries.delete(oldKey);
      this.numBytes -= entry.numBytes;
    }
    this.entries.set(key, { outputs, numBytes, owner });
    this.numBytes += numBytes;
  }

  /** Drops every entry `owner` (a served version) inserted. */
  evictOwner(owner: object): void {
    for (const [key, entry] of this.entries) {
      if (entry.owner !== owner) continue;
      this.entries.delete(key);
      this.numBytes -= entry.numBytes;
    }
  }
}

// Checks a ForwardBatch against the loaded model before it crosses into C++, which trusts it:
// array lengths, token ids, positions, block tables (every slot a token writes or reads must
// have a block) and sampling parameters. Errors name the field, the sequence and the value.
import type { ForwardBatch, ModelInfo } from './api.ts';

function fail(field: string, message: string): never {
  throw new RangeError(`ForwardBatch.${field}: ${message}`);
}

function requireCount(field: string, value: number): void {
  if (!Number.isSafeInteger(value) || value < 0) fail(field, `expected a non-negative integer, got ${value}`);
}

function requireLength(field: string, array: ArrayLike<unknown>, length: number): void {
  if (array.length < length) fail(field, `holds ${array.length} entries, needs ${length}`);
}

export function validateForwardBatch(batch: ForwardBatch, info: ModelInfo): void {
  const { numSeqs, numTokens, maxBlocksPerSeq } = batch;
  requireCount('numSeqs', numSeqs);
  requireCount('numTokens', numTokens);
  requireCount('maxBlocksPerSeq', maxBlocksPerSeq);
  requireLength('tokenIds', batch.tokenIds, numTokens);
  requireLength('positions', batch.positions, numTokens);
  requireLength('queryStarts', batch.queryStarts, numSeqs + 1);
  requireLength('blockTables', batch.blockTables, numSeqs * maxBlocksPerSeq);
  for (const field of ['seqFlags', 'temperatures', 'topPs', 'topKs', 'seeds', 'outputIndices'] as const) {
    requireLength(field, batch[field], numSeqs);
  }
  if (batch.queryStarts[0] !== 0) fail('queryStarts', `must start at 0, got ${batch.queryStarts[0]}`);
  if (batch.queryStarts[numSeqs] !== numTokens) {
    fail('queryStarts', `must end at numTokens (${numTokens}), got ${batch.queryStarts[numSeqs]}`);
  }
  for (let seq = 0; seq < numSeqs; seq++) validateSequence(batch, info, seq);
}

function validateSequence(batch: ForwardBatch, info: ModelInfo, seq: number): void {
  const begin = batch.queryStarts[seq];
  const end = batch.queryStarts[seq + 1];
  if (!(end > begin)) fail('queryStarts', `sequence ${seq} has no tokens ([${begin}, ${end}))`);
  for (let t = begin; t < end; t++) {
    const tokenId = batch.tokenIds[t];
    if (!(tokenId >= 0 && tokenId < info.vocabSize)) fail('tokenIds', `token ${t} is ${tokenId}, outside [0, ${info.vocabSize})`);
    const position = batch.positions[t];
    const expected = t === begin ? position : batch.positions[t - 1] + 1;
    if (!(position >= 0) || position !== expected) {
      fail('positions', `sequence ${seq} token ${t} has position ${position}; positions must be non-negative and consecutive`);
    }
  }
  validateBlockTable(batch, info, seq, batch.positions[begin], batch.positions[end - 1]);
  validateSampling(batch, seq);
}

/** Every block holding a position this sequence writes or attends to must be a real block. */
function validateBlockTable(batch: ForwardBatch, info: ModelInfo, seq: number, firstPosition: number, lastPosition: number): void {
  const { blockSizeTokens, numKvBlocks } = info;
  const lastBlock = Math.floor(lastPosition / blockSizeTokens);
  if (lastBlock >= batch.maxBlocksPerSeq) {
    fail('blockTables', `sequence ${seq} reaches position ${lastPosition}, which needs ${lastBlock + 1} blocks; maxBlocksPerSeq is ${batch.maxBlocksPerSeq}`);
  }
  const window = info.slidingWindowTokens;
  const firstVisible = window === null ? 0 : Math.max(0, firstPosition - window + 1);
  const row = seq * batch.maxBlocksPerSeq;
  for (let block = Math.floor(firstVisible / blockSizeTokens); block <= lastBlock; block++) {
    const blockId = batch.blockTables[row + block];
    if (!(blockId >= 0 && blockId < numKvBlocks)) {
      fail('blockTables', `sequence ${seq} block ${block} is ${blockId}, outside [0, ${numKvBlocks})`);
    }
  }
}

function validateSampling(batch: ForwardBatch, seq: number): void {
  const temperature = batch.temperatures[seq];
  if (!(temperature >= 0 && Number.isFinite(temperature))) fail('temperatures', `sequence ${seq} has ${temperature}; expected a finite number >= 0`);
  const topP = batch.topPs[seq];
  if (!(topP > 0 && topP <= 1)) fail('topPs', `sequence ${seq} has ${topP}; expected (0, 1]`);
  const topK = batch.topKs[seq];
  if (!(topK >= 0)) fail('topKs', `sequence ${seq} has ${topK}; expected >= 0`);
  const outputIndex = batch.outputIndices[seq];
  if (!(outputIndex >= 0)) fail('outputIndices', `sequence ${seq} has ${outputIndex}; expected >= 0`);
}

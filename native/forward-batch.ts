// Checks a ForwardBatch against the loaded model before it crosses into C++, which trusts it:
// array lengths, token ids, positions, block tables (every slot a token writes or reads must
// have a block), sampling parameters, and the penalty and bias ranges (CSR offsets, token ids
// unique within a sequence). Errors name the field, the sequence and the value.
import type { ForwardBatch, ModelInfo } from './api.ts';
import { MAX_TOP_LOGPROBS, SEQ_PROMPT_LOGPROBS, SEQ_RETURN_LOGITS, SEQ_SAMPLE } from './api.ts';

const KNOWN_SEQ_FLAGS = SEQ_SAMPLE | SEQ_RETURN_LOGITS | SEQ_PROMPT_LOGPROBS;
const PER_SEQ_FIELDS = [
  'seqFlags',
  'temperatures',
  'topPs',
  'topKs',
  'seeds',
  'outputIndices',
  'minPs',
  'presencePenalties',
  'frequencyPenalties',
  'repetitionPenalties',
  'numTopLogprobs',
  'numPromptTopLogprobs',
  'promptNextTokenIds',
] as const;

/**
 * Duplicate detection without a Set per sequence: lastRangeOf[tokenId] holds the number of the
 * last range that contained the token, numbered across calls so it never needs clearing.
 */
const seenTokens = { lastRangeOf: new Int32Array(0), rangeNumber: 0 };

function startTokenRange(vocabSize: number): number {
  if (seenTokens.lastRangeOf.length < vocabSize || seenTokens.rangeNumber === 2 ** 31 - 1) {
    seenTokens.lastRangeOf = new Int32Array(Math.max(vocabSize, seenTokens.lastRangeOf.length));
    seenTokens.rangeNumber = 0;
  }
  return ++seenTokens.rangeNumber;
}

/** False when tokenId already occurred in the current range. */
function markTokenSeen(tokenId: number, rangeNumber: number): boolean {
  if (seenTokens.lastRangeOf[tokenId] === rangeNumber) return false;
  seenTokens.lastRangeOf[tokenId] = rangeNumber;
  return true;
}

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
  requireLength('blockTables', batch.blockTables, info.kvCacheGroups.length * numSeqs * maxBlocksPerSeq);
  for (const field of PER_SEQ_FIELDS) requireLength(field, batch[field], numSeqs);
  if (batch.queryStarts[0] !== 0) fail('queryStarts', `must start at 0, got ${batch.queryStarts[0]}`);
  if (batch.queryStarts[numSeqs] !== numTokens) {
    fail('queryStarts', `must end at numTokens (${numTokens}), got ${batch.queryStarts[numSeqs]}`);
  }
  validateRangeStarts('penaltyStarts', batch.penaltyStarts, numSeqs, [
    ['penaltyTokenIds', batch.penaltyTokenIds],
    ['penaltyOutputCounts', batch.penaltyOutputCounts],
    ['penaltyInPrompt', batch.penaltyInPrompt],
  ]);
  validateRangeStarts('biasStarts', batch.biasStarts, numSeqs, [
    ['biasTokenIds', batch.biasTokenIds],
    ['biasValues', batch.biasValues],
  ]);
  for (let seq = 0; seq < numSeqs; seq++) validateSequence(batch, info, seq);
  validateBitmasks(batch, info);
  validateDrafts(batch);
}

/** Proposals end a sampled, unconstrained chunk that holds at least one token before them. */
function validateDrafts(batch: ForwardBatch): void {
  const drafts = batch.numDraftTokens;
  if (drafts === undefined || drafts === null) return;
  requireLength('numDraftTokens', drafts, batch.numSeqs);
  for (let seq = 0; seq < batch.numSeqs; seq++) {
    const numDrafts = drafts[seq];
    if (numDrafts === 0) continue;
    const numTokens = batch.queryStarts[seq + 1] - batch.queryStarts[seq];
    if (!(Number.isInteger(numDrafts) && numDrafts > 0 && numDrafts < numTokens)) {
      fail('numDraftTokens', `sequence ${seq} has ${numDrafts} in a chunk of ${numTokens} tokens; expected 0 .. ${numTokens - 1}`);
    }
    if (batch.seqFlags[seq] !== SEQ_SAMPLE) {
      fail('numDraftTokens', `sequence ${seq} carries proposals with seqFlags ${batch.seqFlags[seq]}; only a sampled sequence (${SEQ_SAMPLE}) may`);
    }
    if ((batch.bitmaskRows?.[seq] ?? -1) >= 0) fail('numDraftTokens', `sequence ${seq} carries proposals and a bitmask row; a constrained sequence proposes none`);
  }
}

/** Rows of -1 or within tokenBitmask, rows as wide as the vocabulary, a one-entry counter. */
function validateBitmasks(batch: ForwardBatch, info: ModelInfo): void {
  const rows = batch.bitmaskRows;
  if (rows === undefined || rows === null) return;
  requireLength('bitmaskRows', rows, batch.numSeqs);
  const words = Math.ceil(info.vocabSize / 32);
  if (batch.bitmaskWords !== words) fail('bitmaskWords', `is ${batch.bitmaskWords}; a vocabulary of ${info.vocabSize} needs ${words}`);
  const bitmask = batch.tokenBitmask;
  if (!(bitmask instanceof Int32Array)) fail('tokenBitmask', 'expected an Int32Array with bitmaskRows');
  const numRows = Math.floor(bitmask.length / words);
  for (let seq = 0; seq < batch.numSeqs; seq++) {
    const row = rows[seq];
    if (!(row >= -1 && row < numRows)) fail('bitmaskRows', `sequence ${seq} has ${row}; expected -1 or a row in [0, ${numRows})`);
  }
  const ready = batch.bitmaskReady;
  if (ready === undefined || ready === null) return;
  if (!(ready instanceof Int32Array) || ready.length !== 1) fail('bitmaskReady', 'expected an Int32Array of one entry');
  const target = batch.bitmaskReadyTarget;
  if (!(Number.isSafeInteger(target) && target! >= 0 && target! <= 2 ** 31 - 1)) {
    fail('bitmaskReadyTarget', `is ${target}; expected a non-negative 32-bit integer`);
  }
}

/** CSR offsets: numSeqs + 1 of them, from 0, non-decreasing, within every entry array. */
function validateRangeStarts(field: string, starts: Int32Array, numSeqs: number, entries: Array<[string, ArrayLike<unknown>]>): void {
  requireLength(field, starts, numSeqs + 1);
  if (starts[0] !== 0) fail(field, `must start at 0, got ${starts[0]}`);
  for (let seq = 0; seq < numSeqs; seq++) {
    if (!(starts[seq + 1] >= starts[seq])) {
      fail(field, `sequence ${seq} ends at ${starts[seq + 1]}, before it starts (${starts[seq]}); offsets must not decrease`);
    }
  }
  for (const [entryField, array] of entries) requireLength(entryField, array, starts[numSeqs]);
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
  const flags = batch.seqFlags[seq];
  if ((flags & ~KNOWN_SEQ_FLAGS) !== 0) fail('seqFlags', `sequence ${seq} has ${flags}; known bits are ${KNOWN_SEQ_FLAGS}`);
  validateSampling(batch, seq);
  validatePenalties(batch, info, seq);
  validateLogitBias(batch, info, seq);
  validateLogprobRequests(batch, info, seq);
}

/** In every KV-cache group, each block holding a position this sequence writes or attends to must be a real block. */
function validateBlockTable(batch: ForwardBatch, info: ModelInfo, seq: number, firstPosition: number, lastPosition: number): void {
  const { blockSizeTokens, numKvBlocks } = info;
  const lastBlock = Math.floor(lastPosition / blockSizeTokens);
  if (lastBlock >= batch.maxBlocksPerSeq) {
    fail('blockTables', `sequence ${seq} reaches position ${lastPosition}, which needs ${lastBlock + 1} blocks; maxBlocksPerSeq is ${batch.maxBlocksPerSeq}`);
  }
  info.kvCacheGroups.forEach(({ slidingWindowTokens: window }, group) => {
    const firstVisible = window === null ? 0 : Math.max(0, firstPosition - window + 1);
    const row = (group * batch.numSeqs + seq) * batch.maxBlocksPerSeq;
    const where = info.kvCacheGroups.length === 1 ? `sequence ${seq}` : `KV group ${group} sequence ${seq}`;
    for (let block = Math.floor(firstVisible / blockSizeTokens); block <= lastBlock; block++) {
      const blockId = batch.blockTables[row + block];
      if (!(blockId >= 0 && blockId < numKvBlocks)) fail('blockTables', `${where} block ${block} is ${blockId}, outside [0, ${numKvBlocks})`);
    }
  });
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
  const minP = batch.minPs[seq];
  if (!(minP >= 0 && minP <= 1)) fail('minPs', `sequence ${seq} has ${minP}; expected [0, 1]`);
}

function validatePenalties(batch: ForwardBatch, info: ModelInfo, seq: number): void {
  for (const field of ['presencePenalties', 'frequencyPenalties'] as const) {
    const penalty = batch[field][seq];
    if (!(penalty >= -2 && penalty <= 2)) fail(field, `sequence ${seq} has ${penalty}; expected [-2, 2]`);
  }
  const repetitionPenalty = batch.repetitionPenalties[seq];
  if (!(repetitionPenalty > 0 && Number.isFinite(repetitionPenalty))) {
    fail('repetitionPenalties', `sequence ${seq} has ${repetitionPenalty}; expected a finite number > 0`);
  }
  const rangeNumber = startTokenRange(info.vocabSize);
  for (let entry = batch.penaltyStarts[seq]; entry < batch.penaltyStarts[seq + 1]; entry++) {
    requireRangeToken('penaltyTokenIds', batch.penaltyTokenIds[entry], info, seq, entry, rangeNumber);
    const count = batch.penaltyOutputCounts[entry];
    if (!(count >= 0)) fail('penaltyOutputCounts', `sequence ${seq} entry ${entry} has ${count}; expected >= 0`);
    const inPrompt = batch.penaltyInPrompt[entry];
    if (inPrompt > 1) fail('penaltyInPrompt', `sequence ${seq} entry ${entry} has ${inPrompt}; expected 0 or 1`);
  }
}

function validateLogitBias(batch: ForwardBatch, info: ModelInfo, seq: number): void {
  const rangeNumber = startTokenRange(info.vocabSize);
  for (let entry = batch.biasStarts[seq]; entry < batch.biasStarts[seq + 1]; entry++) {
    requireRangeToken('biasTokenIds', batch.biasTokenIds[entry], info, seq, entry, rangeNumber);
    const value = batch.biasValues[entry];
    if (!(Number.isFinite(value) || value === -Infinity)) {
      fail('biasValues', `sequence ${seq} entry ${entry} has ${value}; expected a finite number or -Infinity`);
    }
  }
}

/** A token id of a sequence's penalty or bias range: in the vocabulary and not yet in the range. */
function requireRangeToken(field: string, tokenId: number, info: ModelInfo, seq: number, entry: number, rangeNumber: number): void {
  if (!(tokenId >= 0 && tokenId < info.vocabSize)) {
    fail(field, `sequence ${seq} entry ${entry} is ${tokenId}, outside [0, ${info.vocabSize})`);
  }
  if (!markTokenSeen(tokenId, rangeNumber)) fail(field, `sequence ${seq} lists token ${tokenId} twice (again at entry ${entry})`);
}

function validateLogprobRequests(batch: ForwardBatch, info: ModelInfo, seq: number): void {
  for (const field of ['numTopLogprobs', 'numPromptTopLogprobs'] as const) {
    const count = batch[field][seq];
    if (!(count >= 0 && count <= MAX_TOP_LOGPROBS)) fail(field, `sequence ${seq} has ${count}; expected 0..${MAX_TOP_LOGPROBS}`);
  }
  if (!(batch.seqFlags[seq] & SEQ_PROMPT_LOGPROBS)) return;
  const nextTokenId = batch.promptNextTokenIds[seq];
  if (!(nextTokenId >= -1 && nextTokenId < info.vocabSize)) {
    fail('promptNextTokenIds', `sequence ${seq} has ${nextTokenId}; expected -1 or a token id in [0, ${info.vocabSize})`);
  }
}

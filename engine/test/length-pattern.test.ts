// A string's length bound as json-schema.ts writes it (one alternative per length, for short
// bounds) against the counted repetition it stands for: xgrammar gives the same mask at every
// step of random walks (fresh each run) over conduit-tiny's vocabulary, so the rewrite changes
// what a mask costs, never an output.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import path from 'node:path';
import { packageRoot } from '../../package-root.ts';
import { prepareJsonSchema } from '../grammar/json-schema.ts';
import { loadGrammarVocabulary } from '../grammar/vocabulary.ts';
import { loadXgrammar } from '../grammar/xgrammar.ts';

const MODEL_DIR = path.join(packageRoot, 'models', 'conduit-tiny');
const VOCAB_SIZE = 4096;
const EOS = 4095;
const JSON_OPTIONS = [false, -1, [', ', ': '] as [string, string], true] as const;
const NUM_WALKS = 6;

const allowedIds = (mask: Int32Array) => {
  const ids: number[] = [];
  for (let id = 0; id < VOCAB_SIZE; id++) if ((mask[id >> 5] >>> (id & 31)) & 1) ids.push(id);
  return ids;
};

test('a short length bound written per length masks exactly as the counted repetition', async () => {
  const xgrammar = loadXgrammar();
  const vocabulary = loadGrammarVocabulary(MODEL_DIR, VOCAB_SIZE);
  const info = await xgrammar.TokenizerInfo.createTokenizerInfo(vocabulary.encodedTokens, vocabulary.vocabType, vocabulary.prependSpace, VOCAB_SIZE, [EOS]);
  const compiler = await xgrammar.GrammarCompiler.createGrammarCompiler(info, false);
  for (const [minLength, maxLength] of [[0, randomInt(1, 17)], [randomInt(1, 8), 16], [0, 0]]) {
    const schemaOf = (name: unknown) => JSON.stringify({ type: 'object', properties: { name }, required: ['name'], additionalProperties: false });
    const prepared = prepareJsonSchema(schemaOf({ type: 'string', minLength, maxLength }));
    assert.ok(!('code' in prepared), `{${minLength},${maxLength}} refused`);
    assert.doesNotMatch(prepared.schema, /\{\d+,\d*\}/, 'a bound of 16 or less is written per length');
    const repetition = schemaOf({ type: 'string', pattern: `^[^"\\\\\\u0000-\\u001f]{${minLength},${maxLength}}$` });
    const [rewritten, counted] = await Promise.all([prepared.schema, repetition].map((schema) => compiler.compileJSONSchema(schema, ...JSON_OPTIONS)));
    for (let walk = 0; walk < NUM_WALKS; walk++) {
      const [a, b] = await Promise.all([rewritten, counted].map((grammar) => xgrammar.GrammarMatcher.createGrammarMatcher(grammar)));
      for (let step = 0; !a.isTerminated(); step++) {
        const [maskA, maskB] = [await a.getNextTokenBitmask(), await b.getNextTokenBitmask()];
        assert.deepEqual(allowedIds(maskA), allowedIds(maskB), `{${minLength},${maxLength}}, walk ${walk}, step ${step}`);
        const allowed = allowedIds(maskA);
        assert.ok(allowed.length > 0 && step < 200, `{${minLength},${maxLength}}: the walk ends`);
        const tokenId = allowed[randomInt(allowed.length)];
        assert.equal(a.acceptToken(tokenId), true);
        assert.equal(b.acceptToken(tokenId), true);
      }
      assert.equal(b.isTerminated(), true);
      a.dispose();
      b.dispose();
    }
    rewritten.dispose();
    counted.dispose();
  }
});

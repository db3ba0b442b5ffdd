// POST /tokenize and POST /detokenize, as vLLM serves them.
import type { FastifyInstance } from 'fastify';
import type { ModelRegistry } from '../served-model.ts';
import { chatPromptTokenIds } from './chat.ts';
import { checkTokenIds } from './prepare.ts';
import { detokenizeRequestSchema, parseRequest, tokenizeRequestSchema } from './schemas.ts';

export function registerTokenizeRoutes(app: FastifyInstance, registry: ModelRegistry) {
  app.post('/tokenize', async (httpRequest) => {
    const request = parseRequest(tokenizeRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    const tokens =
      'messages' in request
        ? chatPromptTokenIds(model, request.messages, request.add_generation_prompt)
        : model.tokenizer.encode(request.prompt, { addSpecialTokens: request.add_special_tokens });
    return { tokens, count: tokens.length, max_model_len: model.maxModelLen };
  });

  app.post('/detokenize', async (httpRequest) => {
    const request = parseRequest(detokenizeRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    checkTokenIds(model, request.tokens, 'tokens');
    return { prompt: model.tokenizer.decode(request.tokens, { skipSpecialTokens: false }) };
  });
}

// POST /tokenize and POST /detokenize, as vLLM serves them.
import type { FastifyInstance } from 'fastify';
import type { PromptEncoder } from '../prompt-encoder.ts';
import type { ModelRegistry } from '../served-model.ts';
import { chatMessagesOf } from './chat.ts';
import { checkTokenIds } from '../generation-request.ts';
import { clientIsConnected } from './respond.ts';
import { detokenizeRequestSchema, parseRequest, tokenizeRequestSchema } from './schemas.ts';

export function registerTokenizeRoutes(app: FastifyInstance, registry: ModelRegistry, prompts: PromptEncoder) {
  app.post('/tokenize', async (httpRequest) => {
    const request = parseRequest(tokenizeRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    const isWanted = clientIsConnected(httpRequest);
    const tokens =
      'messages' in request
        ? await prompts.encodeChat(model, chatMessagesOf(request.messages), request.add_generation_prompt, { isWanted, fitContext: false })
        : await prompts.encodePrompt(model, request.prompt, request.add_special_tokens, { isWanted, fitContext: false });
    return { tokens, count: tokens.length, max_model_len: model.maxModelLen };
  });

  app.post('/detokenize', async (httpRequest) => {
    const request = parseRequest(detokenizeRequestSchema, httpRequest.body);
    const model = registry.get(request.model);
    checkTokenIds(model, request.tokens, 'tokens');
    return { prompt: model.tokenizer.decode(request.tokens, { skipSpecialTokens: false }) };
  });
}

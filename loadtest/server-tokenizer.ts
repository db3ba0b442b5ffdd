// Client for the vLLM-style tokenizer endpoints that Conduit serves: POST /tokenize
// {model, prompt} -> {tokens, count}, POST /detokenize {model, tokens} -> {prompt}. Used to
// build prompts of exact length and to count output tokens when a stream carries no usage.

export class ServerTokenizer {
  private constructor(
    private readonly baseUrl: string,
    private readonly model: string,
    /** Ids the server adds to every tokenization (BOS and the like), not part of the text. */
    readonly specialIds: readonly number[],
  ) {}

  /** The tokenizer when the server has one; otherwise the reason it cannot be used. */
  static async probe(baseUrl: string, model: string): Promise<ServerTokenizer | { unavailable: string }> {
    try {
      const special = await probeTokens(baseUrl, model, '');
      if (typeof special === 'string') return { unavailable: special };
      // A /tokenize of another shape (llama-server's reads `content`) gives a word no tokens.
      const word = await probeTokens(baseUrl, model, 'hello');
      if (typeof word === 'string') return { unavailable: word };
      if (word.length <= special.length) return { unavailable: 'POST /tokenize gave a word no tokens: it takes another request shape' };
      return new ServerTokenizer(baseUrl, model, special);
    } catch (err) {
      return { unavailable: `POST /tokenize failed: ${describeFetchError(err)}` };
    }
  }

  /** Token ids of the text alone, without the ids the server adds around every prompt. */
  async tokenize(text: string): Promise<number[]> {
    const response = await postJson(this.baseUrl, '/tokenize', { model: this.model, prompt: text });
    if (!response.ok) throw new Error(`POST /tokenize answered ${response.status}: ${await response.text()}`);
    const { tokens } = (await response.json()) as { tokens: number[] };
    return this.stripSpecialIds(tokens);
  }

  async detokenize(ids: readonly number[]): Promise<string> {
    const response = await postJson(this.baseUrl, '/detokenize', { model: this.model, tokens: ids });
    if (!response.ok) throw new Error(`POST /detokenize answered ${response.status}: ${await response.text()}`);
    return ((await response.json()) as { prompt: string }).prompt;
  }

  async countTokens(text: string): Promise<number> {
    return (await this.tokenize(text)).length;
  }

  private stripSpecialIds(tokens: number[]): number[] {
    const special = this.specialIds;
    if (special.length === 0 || tokens.length < special.length) return tokens;
    for (let i = 0; i < special.length; i++) if (tokens[i] !== special[i]) return tokens;
    return tokens.slice(special.length);
  }
}

/** The ids the server gives prompt, or why it gives none. */
async function probeTokens(baseUrl: string, model: string, prompt: string): Promise<number[] | string> {
  const response = await postJson(baseUrl, '/tokenize', { model, prompt });
  if (!response.ok) return `POST /tokenize answered ${response.status}`;
  const body = (await response.json()) as { tokens?: unknown };
  return Array.isArray(body.tokens) ? (body.tokens as number[]) : 'POST /tokenize returned no tokens array';
}

function postJson(baseUrl: string, path: string, body: unknown): Promise<Response> {
  return fetch(baseUrl + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
}

/** fetch hides the socket error (ECONNREFUSED, ...) in err.cause. */
export function describeFetchError(err: unknown): string {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  return cause?.code ?? cause?.message ?? (err as Error).message;
}

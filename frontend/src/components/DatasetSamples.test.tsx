import { describe, expect, it } from 'vitest';

import { recipeSummary } from './DatasetSamples';

describe('recipeSummary', () => {
  it('names each text input with the token field it is made from, and an additive mask as such', () => {
    expect(recipeSummary({
      type: 'text', max_length: 64,
      inputs: { input_ids: 'ids', attention_mask: { field: 'attention_mask', dtype: 'float32', shape: [1, 1, 64], additive: -30 } },
    })).toBe('text: tokenizer.json, 64 tokens, ids → input_ids, attention_mask (additive -30) → attention_mask');
    expect(recipeSummary({ type: 'text', max_length: 12, inputs: { token_type_ids: { field: 'type_ids', dtype: 'int32' } } }))
      .toBe('text: tokenizer.json, 12 tokens, type_ids → token_type_ids');
  });
});

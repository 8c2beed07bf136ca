import { render, screen } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { useState } from 'react';
import { describe, expect, it } from 'vitest';
import type { Dataset, ModelVersion } from '../api/types';
import { DatasetFeedsFields, emptyFeedsForm, feedsToJob, type FeedsForm } from './DatasetFeedsFields';
import { DatasetSamples } from './DatasetSamples';

const VAD = {
  id: 1,
  number: 1,
  signature: {
    inputs: [
      { name: 'input', dtype: 'float32', shape: ['batch', 'sequence'] },
      { name: 'state', dtype: 'float32', shape: [2, 'batch', 128] },
      { name: 'sr', dtype: 'int64', shape: [] },
    ],
    outputs: [
      { name: 'output', dtype: 'float32', shape: ['batch', 1] },
      { name: 'stateN', dtype: 'float32', shape: [2, 'batch', 128] },
    ],
  },
} as unknown as ModelVersion;

function Harness({ onValue }: { onValue: (value: FeedsForm) => void }) {
  const [value, setValue] = useState<FeedsForm>(emptyFeedsForm);
  return (
    <DatasetFeedsFields
      version={VAD}
      value={value}
      hasCalibration
      onChange={(next) => {
        setValue(next);
        onValue(next);
      }}
    />
  );
}

describe('DatasetFeedsFields', () => {
  it('maps a state output to an input with its first value, and a seeded calibration subset', async () => {
    let latest: FeedsForm = emptyFeedsForm;
    render(<Harness onValue={(value) => (latest = value)} />);
    await userEvent.click(screen.getByTestId('add-state'));
    expect(feedsToJob(latest).problems).toEqual(['Choose both the output and the input of every state row.']);
    await userEvent.selectOptions(screen.getByTestId('state-output'), 'stateN');
    await userEvent.selectOptions(screen.getByTestId('state-input'), 'state');
    await userEvent.type(screen.getByTestId('subset-count'), '64');
    await userEvent.clear(screen.getByTestId('subset-seed'));
    await userEvent.type(screen.getByTestId('subset-seed'), '7');
    expect(feedsToJob(latest)).toEqual({
      fields: { state: { stateN: 'state' }, initial_state: { state: 0 }, calibration_subset: { count: 64, seed: 7, stratify: true } },
      problems: [],
    });
    expect(screen.queryByTestId('feeds-problems')).toBeNull();
  });

  it('says when a count is not a whole number', () => {
    expect(feedsToJob({ ...emptyFeedsForm, subsetCount: '2.5' }).problems).toEqual([
      'The calibration subset is a whole number of samples, 1 or more.',
    ]);
  });
});

describe('DatasetSamples', () => {
  it('shows the recipe in words and the first samples as thumbnails or text with tokens', () => {
    const images = {
      id: 1, name: 'faces', kind: 'validation', samples: 4, arrays: {}, has_labels: true, sha256: '', size_bytes: 0, created_at: '',
      recipe: { type: 'image', input: 'images', size: [320, 320], resize: 'shorter_side_crop', color: 'RGB', scale: 1 / 255, mean: [0, 0, 0], std: [1, 1, 1], layout: 'NCHW', dtype: 'float32', label_names: ['a', 'b'] },
      previews: [{ name: 'a/1.jpg', thumbnail: 'data:image/png;base64,AAAA' }],
    } as Dataset;
    const { unmount } = render(<DatasetSamples dataset={images} />);
    expect(screen.getByTestId('dataset-recipe').textContent).toContain('images → images: 320×320 crop, RGB');
    expect(screen.getByTestId('dataset-recipe').textContent).toContain('labels from folders: a, b');
    expect(screen.getByAltText('a/1.jpg').getAttribute('src')).toBe('data:image/png;base64,AAAA');
    unmount();
    const text = {
      ...images, recipe: { type: 'text', inputs: { input_ids: 'ids' }, max_length: 12 },
      previews: [{ name: 'line 1', text: 'good day', tokens: ['[CLS]', 'good', 'day', '[SEP]'] }],
    } as Dataset;
    render(<DatasetSamples dataset={text} />);
    expect(screen.getByTestId('dataset-recipe').textContent).toContain('text: tokenizer.json, 12 tokens, ids → input_ids');
    expect(screen.getByText('[CLS] good day [SEP]')).toBeTruthy();
  });
});

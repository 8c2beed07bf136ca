/** How a dataset was made and what its first samples look like: the recipe in words, then thumbnails,
 * waveform envelopes or lines of text with their tokens. */
import type { Dataset, DatasetPreview, DatasetRecipe, TextInputSpec } from '../api/types';
import { formatScale } from '../format';

function textField(spec: string | TextInputSpec): string {
  if (typeof spec === 'string') return spec;
  return spec.additive !== undefined ? `${spec.field} (additive ${spec.additive})` : spec.field;
}

export function recipeSummary(recipe: DatasetRecipe): string {
  if (recipe.type === 'image') {
    const [height, width] = recipe.size ?? [0, 0];
    const normalize = (recipe.mean ?? []).some((value) => value !== 0) || (recipe.std ?? []).some((value) => value !== 1)
      ? `, mean ${JSON.stringify(recipe.mean)} std ${JSON.stringify(recipe.std)}`
      : '';
    return `images → ${recipe.input}: ${width}×${height} ${recipe.resize === 'shorter_side_crop' ? 'crop' : 'stretch'}, ${recipe.color}, ×${formatScale(Number(recipe.scale ?? 1))}${normalize}, ${recipe.layout} ${recipe.dtype}`;
  }
  if (recipe.type === 'audio') {
    return `audio → ${recipe.input}: ${recipe.sample_rate} Hz${recipe.resample ? ' (resampled)' : ''}${recipe.length ? `, ${recipe.length} samples` : ''}, ${recipe.dtype}`;
  }
  const fed = Object.entries(recipe.inputs ?? {}).map(([input, spec]) => `${textField(spec)} → ${input}`).join(', ');
  return `text: tokenizer.json, ${recipe.max_length} tokens, ${fed}`;
}

function Envelope({ values }: { values: number[] }) {
  const peak = Math.max(...values, 1e-6);
  return (
    <svg className="waveform" width={96} height={24} viewBox="0 0 96 24" role="img" aria-label="waveform envelope">
      {values.map((value, index) => {
        const height = Math.max(1, (value / peak) * 22);
        return <rect key={index} x={index * 3} y={12 - height / 2} width={2} height={height} />;
      })}
    </svg>
  );
}

function Sample({ preview }: { preview: DatasetPreview }) {
  if (preview.thumbnail) {
    return (
      <figure className="dataset-sample">
        <img className="tensor-thumbnail" src={preview.thumbnail} alt={preview.name} width={48} height={48} />
        <figcaption className="muted small">{preview.name}</figcaption>
      </figure>
    );
  }
  if (preview.envelope) {
    return (
      <figure className="dataset-sample">
        <Envelope values={preview.envelope} />
        <figcaption className="muted small">
          {preview.name} · {preview.seconds} s
        </figcaption>
      </figure>
    );
  }
  return (
    <figure className="dataset-sample">
      <q>{preview.text}</q>
      <figcaption className="muted small">
        {preview.name} · <code>{(preview.tokens ?? []).join(' ')}</code>
      </figcaption>
    </figure>
  );
}

export function DatasetSamples({ dataset }: { dataset: Dataset }) {
  const recipe = dataset.recipe && 'type' in dataset.recipe ? (dataset.recipe as DatasetRecipe) : null;
  if (!recipe) {
    return <span className="muted small">{dataset.format === 'samples' ? 'one .npz per sample' : 'arrays'}</span>;
  }
  return (
    <div data-testid="dataset-recipe">
      <p className="small">
        {recipeSummary(recipe)}
        {recipe.label_names?.length ? <span className="muted"> · labels from folders: {recipe.label_names.join(', ')}</span> : null}
      </p>
      <div className="dataset-samples" data-testid="dataset-previews">
        {(dataset.previews ?? []).map((preview) => (
          <Sample key={preview.name} preview={preview} />
        ))}
      </div>
    </div>
  );
}

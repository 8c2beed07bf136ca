/** Calibration and validation datasets: arrays (.npz, or a zip of one .npz per sample) or raw images,
 * audio and text through a declared recipe; upload and list with their arrays, recipe and first samples. */
import { useId, useState } from 'react';
import { useQueryClient } from '@tanstack/react-query';
import { keys, PAGE_SIZE, rows, totalCount, useDatasets, useDeleteDataset, useCanWrite } from '../api/hooks';
import type { Dataset, DatasetKind } from '../api/types';
import { EmptyState, PageHeader, Pager, StatusBadge } from '../components/common';
import { DataTable } from '../components/DataTable';
import { SelectField, TextField } from '../components/FormFields';
import { ListStates } from '../components/ListStates';
import { RowAction } from '../components/RowAction';
import { DatasetSamples } from '../components/DatasetSamples';
import { UploadZone } from '../components/UploadZone';
import { formatBytes, formatDate, formatShape } from '../format';
import { fileStem } from './ModelsPage';

export function DatasetArrays({ dataset }: { dataset: Dataset }) {
  const entries = Object.entries(dataset.arrays ?? {});
  if (entries.length === 0) return <span className="muted">—</span>;
  return (
    <ul className="plain-list">
      {entries.map(([name, spec]) => (
        <li key={name}>
          <code>{name}</code> <span className="muted small">{spec.dtype}</span> <code>{formatShape(spec.shape)}</code>
        </li>
      ))}
    </ul>
  );
}

const RECIPE_EXAMPLE = '{"type": "image", "input": "images", "size": [224, 224], "color": "RGB", "scale": 0.00392, "layout": "NCHW"}';

/** The recipe's type while the user types it (null when empty or not JSON yet). */
export function recipeKind(text: string): 'image' | 'audio' | 'text' | null {
  if (!text.trim()) return null;
  try {
    const parsed = JSON.parse(text) as { type?: unknown };
    return parsed.type === 'image' || parsed.type === 'audio' || parsed.type === 'text' ? parsed.type : null;
  } catch {
    return null;
  }
}

export function DatasetsPage() {
  const [page, setPage] = useState(1);
  const datasets = useDatasets(page);
  const deleteDataset = useDeleteDataset();
  const client = useQueryClient();
  const canWrite = useCanWrite();
  const [name, setName] = useState('');
  const [kind, setKind] = useState<DatasetKind>('calibration');
  const recipeId = useId();
  const tokenizerId = useId();
  const [recipe, setRecipe] = useState('');
  const [tokenizer, setTokenizer] = useState<File | null>(null);
  const list = rows(datasets.data);
  const recipeType = recipeKind(recipe);

  return (
    <>
      <PageHeader
        title="Datasets"
        subtitle="Calibration data tunes int8 quantization; validation data measures accuracy on your devices."
      />
      <section className="card" aria-labelledby="upload-dataset-heading">
        <h2 id="upload-dataset-heading">Upload a dataset</h2>
        <p className="muted small">
          An <code>.npz</code> with one array per model input, named like the inputs, and an optional{' '}
          <code>labels</code> array for task accuracy. An array with the input&apos;s rank is batch-first; one more axis
          stacks the exact tensors fed (scalars, batch not first); two more are sequences of calls. Samples of different
          shapes go in a <code>.zip</code> of one <code>.npz</code> per sample. Raw data (a <code>.zip</code> of images or
          WAV files, a <code>.txt</code> of lines) needs a recipe.
        </p>
        <div className="form-row">
          <TextField
            label="Name"
            value={name}
            placeholder="Defaults to the file name"
            onChange={(event) => setName(event.target.value)}
            data-testid="dataset-name-input"
          />
          <SelectField
            label="Kind"
            value={kind}
            onChange={(event) => setKind(event.target.value as DatasetKind)}
            data-testid="dataset-kind-select"
          >
            <option value="calibration">Calibration</option>
            <option value="validation">Validation</option>
          </SelectField>
        </div>
        <div className="field">
          <label htmlFor={recipeId}>Recipe for raw data (JSON, optional)</label>
          <textarea
            id={recipeId}
            rows={3}
            value={recipe}
            placeholder={RECIPE_EXAMPLE}
            onChange={(event) => setRecipe(event.target.value)}
            data-testid="dataset-recipe-input"
          />
          <p className="muted small">
            Images: size, resize (stretch or shorter_side_crop), color (RGB, BGR, L), scale, mean, std, layout (NCHW or
            NHWC), dtype; class folders become labels. Audio: sample_rate, resample, length. Text: max_length, inputs
            (model input → ids, attention_mask or type_ids, or an object such as{' '}
            <code>{'{"field": "attention_mask", "dtype": "float32", "shape": [1, 1, 64], "additive": -30}'}</code> for a mask
            fed as an additive bias) and the model&apos;s tokenizer.json below.
          </p>
        </div>
        {recipeType === 'text' ? (
          <div className="field">
            <label htmlFor={tokenizerId}>tokenizer.json</label>
            <input
              id={tokenizerId}
              type="file"
              accept=".json"
              onChange={(event) => setTokenizer(event.target.files?.[0] ?? null)}
              data-testid="dataset-tokenizer-input"
            />
          </div>
        ) : null}
        <UploadZone<Dataset>
          disabled={!canWrite}
          label={recipeType ? (recipeType === 'text' ? 'Lines of text (.txt)' : `Zip of ${recipeType} files (.zip)`) : 'NumPy archive (.npz) or zip of samples (.zip)'}
          accept={recipeType === 'text' ? ['.txt'] : recipeType ? ['.zip'] : ['.npz', '.zip']}
          testId="dataset-upload"
          buildRequest={(file) => {
            const form = new FormData();
            form.append('name', name.trim() || fileStem(file.name));
            form.append('kind', kind);
            form.append('file', file);
            if (recipe.trim()) form.append('recipe', recipe.trim());
            if (recipeType === 'text' && tokenizer) form.append('tokenizer', tokenizer);
            return { path: 'datasets/', form };
          }}
          onUploaded={() => {
            setName('');
            void client.invalidateQueries({ queryKey: keys.datasets });
          }}
          describeResult={(dataset) => (
            <span>
              {dataset.name}: {dataset.samples} samples
            </span>
          )}
        />
      </section>

      <section className="card" aria-labelledby="dataset-list-heading">
        <h2 id="dataset-list-heading">All datasets</h2>
        <ListStates
          error={datasets.error ?? deleteDataset.error}
          pending={datasets.isPending}
          empty={list.length === 0}
          whenEmpty={
            <EmptyState title="No datasets yet.">
              Upload a calibration set (a few hundred representative inputs) to enable int8, and a validation set to
              measure accuracy.
            </EmptyState>
          }
        >
          <DataTable
            columns={['Name', 'Kind', 'Samples', 'Arrays', 'Made from', 'Labels', 'Size', 'Uploaded']}
            actions
            testId="datasets-table"
            footer={<Pager page={page} count={totalCount(datasets.data)} pageSize={PAGE_SIZE} onPage={setPage} label="Datasets" />}
          >
            {list.map((dataset) => (
              <tr key={dataset.id} data-testid="dataset-row">
                <td>{dataset.name}</td>
                <td>
                  <StatusBadge status={dataset.kind === 'calibration' ? 'queued' : 'running'} label={dataset.kind} />
                </td>
                <td data-testid="dataset-samples">{dataset.samples}</td>
                <td>
                  <DatasetArrays dataset={dataset} />
                </td>
                <td>
                  <DatasetSamples dataset={dataset} />
                </td>
                <td>{dataset.has_labels ? 'Yes' : 'No'}</td>
                <td>{formatBytes(dataset.size_bytes)}</td>
                <td>{formatDate(dataset.created_at)}</td>
                <td>
                  <RowAction
                    label={`Delete dataset ${dataset.name}`}
                    question={`Delete dataset ${dataset.name}?`}
                    onConfirm={() => deleteDataset.mutate(dataset.id)}
                  >
                    Delete
                  </RowAction>
                </td>
              </tr>
            ))}
          </DataTable>
        </ListStates>
      </section>
    </>
  );
}

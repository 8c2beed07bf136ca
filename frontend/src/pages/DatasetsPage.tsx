/** Calibration and validation datasets: arrays (.npz, or a zip of one .npz per sample) or raw images,
 * audio and text through a declared recipe; upload and list with their arrays, recipe and first samples. */
import { useEffect, useId, useState } from 'react';
import { useQuery, useQueryClient } from '@tanstack/react-query';
import { useSearchParams } from 'react-router';
import { api, errorMessage, uploadWithProgress } from '../api/client';
import { keys, PAGE_SIZE, rows, totalCount, useDatasets, useDeleteDataset, useCanWrite, useModels } from '../api/hooks';
import type { Dataset, DatasetKind, Model, RawPreview, RecipeProposal } from '../api/types';
import { countRawFiles, entryName, isRawFile, packFiles, previewFiles, sha256Hex, zipEntryNames } from '../components/zip';
import { EmptyState, PageHeader, Pager, StatusBadge } from '../components/common';
import { DataTable } from '../components/DataTable';
import { SelectField, TextField } from '../components/FormFields';
import { ListStates } from '../components/ListStates';
import { RowAction } from '../components/RowAction';
import { DatasetSamples } from '../components/DatasetSamples';
import { UploadZone } from '../components/UploadZone';
import { formatBytes, formatDate, formatScale, formatShape } from '../format';
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

const RECIPE_EXAMPLE = 'Choose the model above and Kiln proposes one; or write it, e.g. {"type": "image", "input": "images", "size": [224, 224]}';
/** A zip the user made is sent whole for its preview only up to this size. */
const PREVIEW_ZIP_BYTES = 16 * 1024 * 1024;
/** Files hashed in the browser to recognise the same files uploaded before; larger ones are not checked. */
const HASH_LIMIT_BYTES = 256 * 1024 * 1024;
/** Models offered, one click each, for a zip of images chosen without a recipe. */
const RECIPE_OFFERS = 4;

interface PendingUpload {
  file: File;
  files: number;
  preview: RawPreview | null;
  error: string | null;
  /** Datasets made from exactly these files before. */
  same: Dataset[];
  resolve: (file: File | null) => void;
}

/** A zip of images or recordings chosen with no recipe: held until the user takes a model's recipe (or cancels). */
interface NeedsRecipe {
  file: File;
  raw: number;
  error: string | null;
  resolve: (file: File | null) => void;
}

/** "4 classes: circle 10, square 10, star 7, triangle 3", or null without class folders. */
export function classSummary(classes: Record<string, number> | undefined): string | null {
  const entries = Object.entries(classes ?? {});
  if (entries.length === 0) return null;
  return `${entries.length} class${entries.length === 1 ? '' : 'es'}: ${entries.map(([name, count]) => `${name} ${count}`).join(', ')}`;
}

/** Why it matters that these files were uploaded before, as the other kind: accuracy measured on the calibration data. */
export function sameFilesWarning(same: Dataset[], kind: DatasetKind): string | null {
  if (same.length === 0) return null;
  const other = same.find((dataset) => dataset.kind !== kind);
  if (other) {
    return `These are the same files as the ${other.kind} dataset “${other.name}”: int8 would be tuned on the data its accuracy is measured on, which reads better than new data will. Keep some files apart for validation.`;
  }
  return `These files are already the ${kind} dataset “${same[0].name}”.`;
}

/** The model raw data feeds: its proposal fills the recipe, and the preview checks the tensors against its input. */
function useRecipeProposal(model: Model | null) {
  const version = model?.latest_version ?? model?.versions?.[model.versions.length - 1] ?? null;
  const proposal = useQuery({
    queryKey: ['models', model?.id, 'recipe', version?.number],
    queryFn: () => api<RecipeProposal>(`models/${model?.id}/versions/${version?.number}/recipe/`),
    enabled: !!model && !!version,
  });
  return { version, proposal };
}

/** What the recipe makes of the first files, before the whole upload: thumbnails, tensors, labels, fit. */
function PreviewPanel({ pending, kind, modelName, onUpload, onCancel }: {
  pending: PendingUpload; kind: DatasetKind; modelName: string | null; onUpload: () => void; onCancel: () => void;
}) {
  const preview = pending.preview;
  const classes = classSummary(preview?.classes);
  const size = preview?.previews.find((item) => item.size)?.size;
  const warning = sameFilesWarning(pending.same, kind);
  return (
    <div className="raw-preview" role="region" aria-label="Preview before upload" data-testid="raw-preview">
      <h3>Preview: {pending.file.name}, {pending.files} file{pending.files === 1 ? '' : 's'}</h3>
      {pending.error ? <p className="field-error" role="alert" data-testid="raw-preview-error">{pending.error}</p> : null}
      {preview ? (
        <>
          <p className="small" data-testid="raw-preview-classes">
            {classes ? <>Labels from the class folders: <strong>{classes}</strong>.</> : 'No class folders: no labels.'}
          </p>
          <div className="dataset-previews" data-testid="raw-preview-samples">
            {preview.previews.map((item) => (
              <figure key={item.name} className="dataset-sample" data-testid="raw-preview-sample">
                {item.thumbnail ? <img className="tensor-thumbnail" src={item.thumbnail} alt={item.name} width={72} height={72} /> : null}
                <figcaption className="muted small">{item.label ? <strong>{item.label}</strong> : null}{item.label ? ' · ' : ''}{item.name.split('/').pop()}</figcaption>
              </figure>
            ))}
          </div>
          {size ? (
            <p className="muted small" data-testid="raw-preview-as-fed">
              {classes ? 'One file of each class, ' : ''}as the model gets it: resized{preview.recipe.resize === 'shorter_side_crop' ? ' and centre-cropped' : ''} to {size[1]}×{size[0]}.
            </p>
          ) : null}
          <ul className="plain-list small" data-testid="raw-preview-tensors">
            {Object.entries(preview.arrays).map(([name, spec]) => (
              <li key={name}>
                Each file becomes <code>{name}</code> {spec.dtype} <code>[{spec.shape.join(', ')}]</code>, values {spec.min}…{spec.max}
              </li>
            ))}
          </ul>
          {warning ? <p className="field-warning small" role="alert" data-testid="raw-preview-same-files">{warning}</p> : null}
          {preview.fits ? (
            preview.fits.ok ? (
              <p className="field-ok small" data-testid="raw-preview-fits">Fits {modelName ?? 'the model'}&apos;s input.</p>
            ) : (
              <div className="alert alert-error" role="alert" data-testid="raw-preview-misfit">
                Does not fit {modelName ?? 'the model'}: {preview.fits.problems.join('; ')}. Change the recipe above and choose the files again.
              </div>
            )
          ) : null}
        </>
      ) : pending.error ? null : (
        <p className="muted small">No preview for a zip over 16 MB; the recipe is checked on every file when it uploads.</p>
      )}
      <div className="button-row">
        <button type="button" className="button button-primary" onClick={onUpload} disabled={!!preview?.fits && !preview.fits.ok} data-testid="raw-preview-upload">
          Upload {pending.files} file{pending.files === 1 ? '' : 's'}
        </button>
        <button type="button" className="button" onClick={onCancel} data-testid="raw-preview-cancel">
          Cancel
        </button>
      </div>
    </div>
  );
}

/** A recipe as editable text: one field a line, lists kept on their line, a scale of 1/255 written so. */
export function recipeText(recipe: object): string {
  const field = (key: string, value: unknown) => (key === 'scale' && typeof value === 'number' ? JSON.stringify(formatScale(value)) : JSON.stringify(value));
  return `{\n${Object.entries(recipe).map(([key, value]) => `  ${JSON.stringify(key)}: ${field(key, value)}`).join(',\n')}\n}`;
}

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
  const modelId = useId();
  const models = rows(useModels('', 1, 500).data);
  const [params] = useSearchParams();
  // `?model=ID` (the model page's "Add data for it") chooses the model whose recipe is proposed.
  const [forModel, setForModel] = useState<number | null>(Number(params.get('model')) || null);
  const model = models.find((candidate) => candidate.id === forModel) ?? null;
  const { version, proposal } = useRecipeProposal(model);
  const [pending, setPending] = useState<PendingUpload | null>(null);
  const [needsRecipe, setNeedsRecipe] = useState<NeedsRecipe | null>(null);
  const [prepareError, setPrepareError] = useState<string | null>(null);
  // Every dataset, to recognise files uploaded before (the table below is one page of them).
  const allDatasets = rows(useDatasets(1, 500).data);
  const recipeOffers = model ? [model] : models.slice(0, RECIPE_OFFERS);

  // A new model's proposal replaces the recipe (it is still editable).
  useEffect(() => {
    if (proposal.data?.recipe) setRecipe(recipeText(proposal.data.recipe));
  }, [proposal.data]);

  /** What the recipe makes of the chosen files (a folder is packed into one zip first), shown before anything uploads;
   * resolves with the file to upload, or null when the user cancels. */
  const previewRaw = async (files: File[], recipeJson: string, versionId: number | null): Promise<File | null> => {
    const raw = countRawFiles(files);
    const file = raw > 0 ? await packFiles(files) : files[0];
    const form = new FormData();
    let sample: File | null = file.size <= PREVIEW_ZIP_BYTES ? file : null;
    if (raw > 0) {
      // Only the files shown travel twice; the names of all of them say how many each class has.
      sample = await packFiles(files, previewFiles(files));
      form.append('names', files.filter((chosen) => isRawFile(entryName(chosen))).map(entryName).join('\n'));
    }
    let preview: RawPreview | null = null;
    let error: string | null = null;
    if (sample) {
      form.append('file', sample);
      form.append('recipe', recipeJson.trim());
      if (versionId) form.append('model_version', String(versionId));
      try {
        preview = await uploadWithProgress<RawPreview>('datasets/preview/', form).promise;
      } catch (failure) {
        error = errorMessage(failure);
      }
    }
    const digest = file.size <= HASH_LIMIT_BYTES ? await sha256Hex(file) : null;
    const same = digest ? allDatasets.filter((dataset) => (dataset.source_sha256 ?? dataset.sha256) === digest) : [];
    const count = raw > 0 ? raw : (preview?.files ?? 0);
    return new Promise<File | null>((resolve) => setPending({ file, files: count, preview, error, same, resolve }));
  };

  /** Several files or a folder become one zip; raw data is previewed through the recipe before it uploads. */
  const prepare = async (files: File[]): Promise<File | null> => {
    setPrepareError(null);
    const raw = countRawFiles(files);
    const single = files.length === 1 ? files[0] : null;
    if (single && !isRawFile(entryName(single)) && !recipe.trim() && single.name.toLowerCase().endsWith('.zip')) {
      // A zip of images with no recipe: offer the model's recipe in one click rather than a refusal after the upload.
      const names = await zipEntryNames(single);
      const rawInZip = names.filter(isRawFile).length;
      if (rawInZip > 0 && !names.some((entry) => entry.endsWith('.npy'))) {
        return new Promise<File | null>((resolve) => setNeedsRecipe({ file: single, raw: rawInZip, error: null, resolve }));
      }
      return single;
    }
    if (single && !isRawFile(entryName(single)) && !(recipe.trim() && single.name.toLowerCase().endsWith('.zip'))) return single;
    if (!recipe.trim()) {
      setPrepareError(
        raw > 0
          ? `These are ${raw} image or WAV files: choose the model they feed under "Raw data" and Kiln proposes the recipe (or write one).`
          : 'Choose one .npz or .zip file, or a folder of images.',
      );
      return null;
    }
    if (recipeType === 'text') return single;
    return previewRaw(files, recipe, version?.id ?? null);
  };

  /** One click: the chosen model's proposed recipe for the held zip, then its preview. */
  const takeRecipeOf = async (candidate: Model) => {
    const held = needsRecipe;
    const candidateVersion = candidate.latest_version ?? candidate.versions?.[candidate.versions.length - 1] ?? null;
    if (!held || !candidateVersion) return;
    try {
      const proposed = await api<RecipeProposal>(`models/${candidate.id}/versions/${candidateVersion.number}/recipe/`);
      if (!proposed.recipe) {
        setNeedsRecipe({ ...held, error: `${candidate.name}: ${proposed.why.join(' ')}` });
        return;
      }
      const text = recipeText(proposed.recipe);
      setForModel(candidate.id);
      setRecipe(text);
      setNeedsRecipe(null);
      held.resolve(await previewRaw([held.file], text, candidateVersion.id));
    } catch (failure) {
      setNeedsRecipe({ ...held, error: errorMessage(failure) });
    }
  };
  const settle = (file: File | null) => {
    pending?.resolve(file);
    setPending(null);
  };

  return (
    <>
      <PageHeader
        title="Datasets"
        subtitle="Calibration data tunes int8 quantization; validation data measures accuracy on your devices."
      />
      <section className="card" aria-labelledby="upload-dataset-heading">
        <h2 id="upload-dataset-heading">Upload a dataset</h2>
        <p className="muted small" data-testid="datasets-intro">
          <strong>Images or recordings:</strong> choose the model they feed below, then a folder (class folders become
          labels): Kiln proposes how each file becomes the model&apos;s input and shows a preview before uploading.{' '}
          <strong>Arrays:</strong> an <code>.npz</code> with one array per model input, named like the inputs, and an
          optional <code>labels</code> array for task accuracy. An array with the input&apos;s rank is batch-first; one more
          axis stacks the exact tensors fed (scalars, batch not first); two more are sequences of calls. Samples of
          different shapes go in a <code>.zip</code> of one <code>.npz</code> per sample. A <code>.txt</code> of lines needs a
          text recipe and the model&apos;s tokenizer.json.
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
          <label htmlFor={modelId}>Raw data (images, WAV files): the model it feeds</label>
          <select id={modelId} value={forModel ?? ''} onChange={(event) => setForModel(event.target.value ? Number(event.target.value) : null)} data-testid="recipe-model-select">
            <option value="">None: arrays (.npz), or a recipe I write</option>
            {models.map((candidate) => (
              <option key={candidate.id} value={candidate.id}>
                {candidate.name}
              </option>
            ))}
          </select>
          {proposal.data ? (
            <ul className="plain-list muted small" data-testid="recipe-why">
              {proposal.data.why.map((reason) => (
                <li key={reason}>{reason}</li>
              ))}
            </ul>
          ) : null}
        </div>
        <div className="field">
          <label htmlFor={recipeId}>Recipe for raw data (JSON{model ? `, proposed for ${model.name}: edit if needed` : ', optional'})</label>
          <textarea
            id={recipeId}
            rows={recipe ? Math.min(14, recipe.split('\n').length) : 3}
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
          label={
            recipeType
              ? recipeType === 'text'
                ? 'Lines of text (.txt)'
                : `A folder or zip of ${recipeType} files; class folders become labels`
              : 'NumPy archive (.npz), zip of samples (.zip), or a folder of images (choose the model above)'
          }
          accept={recipeType === 'text' ? ['.txt'] : recipeType ? ['.zip'] : ['.npz', '.zip']}
          folder={recipeType !== 'text'}
          prepare={prepare}
          prepareError={prepareError}
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
        {needsRecipe ? (
          <div className="raw-preview" role="region" aria-label="A recipe for these files" data-testid="zip-needs-recipe">
            <h3>
              {needsRecipe.file.name} holds {needsRecipe.raw} image or WAV file{needsRecipe.raw === 1 ? '' : 's'} and no arrays
            </h3>
            <p className="small">
              Raw data needs a recipe: how each file becomes the model&apos;s input. Take the one Kiln proposes for the model they feed; a
              preview comes before anything uploads.
            </p>
            {needsRecipe.error ? <p className="field-error" role="alert">{needsRecipe.error}</p> : null}
            <div className="button-row">
              {recipeOffers.map((candidate) => (
                <button key={candidate.id} type="button" className="button button-primary" onClick={() => void takeRecipeOf(candidate)} data-testid="use-model-recipe">
                  Use {candidate.name}&apos;s recipe
                </button>
              ))}
              <button
                type="button"
                className="button"
                onClick={() => {
                  needsRecipe.resolve(null);
                  setNeedsRecipe(null);
                }}
                data-testid="zip-needs-recipe-cancel"
              >
                Cancel
              </button>
            </div>
            {recipeOffers.length === 0 ? <p className="muted small">Upload the model first: its recipe is proposed from its inputs.</p> : null}
          </div>
        ) : null}
        {pending ? (
          <PreviewPanel pending={pending} kind={kind} modelName={model?.name ?? null} onUpload={() => settle(pending.file)} onCancel={() => settle(null)} />
        ) : null}
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
            columns={['Name', 'Kind', 'Samples', 'Arrays', 'Made from', 'Labels', { label: 'Size', className: 'col-p3' }, { label: 'Uploaded', className: 'col-p2' }]}
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

/** Calibration and validation datasets (.npz): upload and list with their arrays. */
import { useId, useState } from 'react';
import { useQueryClient } from '@tanstack/react-query';
import { keys, PAGE_SIZE, rows, useDatasets, useDeleteDataset, useCanWrite } from '../api/hooks';
import type { Dataset, DatasetKind } from '../api/types';
import { EmptyState, ErrorMessage, Loading, PageHeader, Pager, StatusBadge } from '../components/common';
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

export function DatasetsPage() {
  const [page, setPage] = useState(1);
  const datasets = useDatasets(page);
  const deleteDataset = useDeleteDataset();
  const client = useQueryClient();
  const canWrite = useCanWrite();
  const [name, setName] = useState('');
  const [kind, setKind] = useState<DatasetKind>('calibration');
  const nameId = useId();
  const kindId = useId();
  const list = rows(datasets.data);

  return (
    <>
      <PageHeader
        title="Datasets"
        subtitle="Calibration data tunes int8 quantization; validation data measures accuracy on your devices."
      />
      <section className="card" aria-labelledby="upload-dataset-heading">
        <h2 id="upload-dataset-heading">Upload a dataset</h2>
        <p className="muted small">
          An <code>.npz</code> with one array per model input (first axis = samples), named like the inputs, and an
          optional <code>labels</code> array for task accuracy.
        </p>
        <div className="form-row">
          <div className="field">
            <label htmlFor={nameId}>Name</label>
            <input
              id={nameId}
              value={name}
              placeholder="Defaults to the file name"
              onChange={(event) => setName(event.target.value)}
              data-testid="dataset-name-input"
            />
          </div>
          <div className="field">
            <label htmlFor={kindId}>Kind</label>
            <select
              id={kindId}
              value={kind}
              onChange={(event) => setKind(event.target.value as DatasetKind)}
              data-testid="dataset-kind-select"
            >
              <option value="calibration">Calibration</option>
              <option value="validation">Validation</option>
            </select>
          </div>
        </div>
        <UploadZone<Dataset>
          disabled={!canWrite}
          label="NumPy archive (.npz)"
          accept={['.npz']}
          testId="dataset-upload"
          buildRequest={(file) => {
            const form = new FormData();
            form.append('name', name.trim() || fileStem(file.name));
            form.append('kind', kind);
            form.append('file', file);
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
        <ErrorMessage error={datasets.error ?? deleteDataset.error} />
        {datasets.isPending ? (
          <Loading />
        ) : list.length === 0 ? (
          <EmptyState title="No datasets yet.">
            Upload a calibration set (a few hundred representative inputs) to enable int8, and a validation set to
            measure accuracy.
          </EmptyState>
        ) : (
          <div className="table-wrap">
            <table className="table" data-testid="datasets-table">
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">Kind</th>
                  <th scope="col">Samples</th>
                  <th scope="col">Arrays</th>
                  <th scope="col">Labels</th>
                  <th scope="col">Size</th>
                  <th scope="col">Uploaded</th>
                  <th scope="col">
                    <span className="visually-hidden">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
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
                    <td>{dataset.has_labels ? 'Yes' : 'No'}</td>
                    <td>{formatBytes(dataset.size_bytes)}</td>
                    <td>{formatDate(dataset.created_at)}</td>
                    <td>
                      <button
                        type="button"
                        className="button button-small button-ghost"
                        aria-label={`Delete dataset ${dataset.name}`}
                        onClick={() => {
                          if (window.confirm(`Delete dataset ${dataset.name}?`)) deleteDataset.mutate(dataset.id);
                        }}
                      >
                        Delete
                      </button>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
            <Pager page={page} count={datasets.data && !Array.isArray(datasets.data) ? datasets.data.count : list.length} pageSize={PAGE_SIZE} onPage={setPage} label="Datasets" />
          </div>
        )}
      </section>
    </>
  );
}

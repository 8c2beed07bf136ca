/** The organization's models: search, upload, and a table linking to each model. */
import { useDeferredValue, useState } from 'react';
import { Link } from 'react-router';
import { useQueryClient } from '@tanstack/react-query';
import { PAGE_SIZE, rows, totalCount, useModels, useCanWrite } from '../api/hooks';
import type { IdenticalVersion, ModelCreated } from '../api/types';
import { EmptyState, PageHeader, Pager } from '../components/common';
import { DataTable } from '../components/DataTable';
import { TextField } from '../components/FormFields';
import { ListStates } from '../components/ListStates';
import { UploadZone } from '../components/UploadZone';
import { formatBytes, formatDate } from '../format';

export function fileStem(name: string): string {
  return name.replace(/\.(onnx|zip|npz)$/i, '');
}

/** An upload with exactly the bytes of an earlier version: say so, and offer the earlier one. */
export function IdenticalNotice({ identical }: { identical: IdenticalVersion[] | undefined }) {
  if (!identical || identical.length === 0) return null;
  const first = identical[0];
  return (
    <div className="small identical-notice" role="status" data-testid="identical-upload">
      Byte-identical to <strong>{first.name} v{first.version}</strong>, which you already have
      {identical.length > 1 ? ` (and ${identical.length - 1} more)` : ''}: its deployments and measurements apply to this file.{' '}
      <Link to={`/models/${first.model}`} data-testid="identical-model-link">
        Open {first.name}
      </Link>
    </div>
  );
}

export function ModelsPage() {
  const [search, setSearch] = useState('');
  const deferredSearch = useDeferredValue(search);
  const [page, setPage] = useState(1);
  const models = useModels(deferredSearch, page);
  const client = useQueryClient();
  const canWrite = useCanWrite();
  const [name, setName] = useState('');
  const list = rows(models.data);

  return (
    <>
      <PageHeader
        title="Models"
        subtitle="Upload a model once (ONNX, or PyTorch: a torch.export .pt2 or a traced .pt); deploy it to every device you own."
      />

      <section className="card" aria-labelledby="upload-model-heading">
        <h2 id="upload-model-heading">Upload a model</h2>
        <TextField
          label="Name"
          className="field field-inline"
          value={name}
          placeholder="Defaults to the file name"
          onChange={(event) => setName(event.target.value)}
          data-testid="model-name-input"
        />
        <UploadZone<ModelCreated>
          disabled={!canWrite}
          label="ONNX model (.onnx, or .zip with external data) or PyTorch (.pt2 torch.export, traced .pt)"
          accept={['.onnx', '.zip', '.pt2', '.pt']}
          multiple
          testId="model-upload"
          buildRequest={(file) => {
            const form = new FormData();
            form.append('name', name.trim() || fileStem(file.name));
            form.append('file', file);
            return { path: 'models/', form };
          }}
          onUploaded={() => {
            setName('');
            void client.invalidateQueries({ queryKey: ['models'] });
          }}
          describeResult={(model) => (
            <>
              <Link to={`/models/${model.id}`} data-testid="uploaded-model-link">
                Open {model.name}
              </Link>
              <IdenticalNotice identical={model.identical_to} />
            </>
          )}
        />
      </section>

      <section className="card" aria-labelledby="model-list-heading">
        <div className="section-header">
          <h2 id="model-list-heading">All models</h2>
          <TextField
            label="Search"
            className="field field-inline search"
            type="search"
            value={search}
            placeholder="Model name"
            onChange={(event) => {
              setSearch(event.target.value);
              setPage(1);
            }}
            data-testid="model-search"
          />
        </div>
        <ListStates
          error={models.error}
          pending={models.isPending}
          empty={list.length === 0}
          whenEmpty={
            search ? (
              <EmptyState title={`No model matches “${search}”.`}>Try a shorter search, or clear it.</EmptyState>
            ) : (
              <EmptyState title="No models yet.">
                Drop an <code>.onnx</code> file above to upload your first model. Kiln reads its signature and
                checks it before you deploy.
              </EmptyState>
            )
          }
        >
          <DataTable
            columns={['Name', 'Latest version', 'Inputs', { label: 'Size', className: 'col-p3' }, { label: 'Opset', className: 'col-p2' }, { label: 'Uploaded', className: 'col-p3' }]}
            testId="models-table"
            footer={<Pager page={page} count={totalCount(models.data)} pageSize={PAGE_SIZE} onPage={setPage} label="Models" />}
          >
            {list.map((model) => {
              const version = model.latest_version ?? model.versions?.[model.versions.length - 1] ?? null;
              return (
                <tr key={model.id} data-testid="model-row">
                  <td>
                    <Link to={`/models/${model.id}`}>{model.name}</Link>
                  </td>
                  <td>{version ? `v${version.number}` : '—'}</td>
                  <td>{version?.signature?.inputs?.map((input) => input.name).join(', ') || '—'}</td>
                  <td>{formatBytes(version?.size_bytes)}</td>
                  <td>{version?.opset ?? '—'}</td>
                  <td>{formatDate(model.created_at)}</td>
                </tr>
              );
            })}
          </DataTable>
        </ListStates>
      </section>
    </>
  );
}

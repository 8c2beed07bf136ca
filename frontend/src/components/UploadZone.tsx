/**
 * Drag-and-drop (or file picker) uploads with a real progress bar per file, a cancel button,
 * and the server's error message shown next to the file that caused it.
 */
import { useEffect, useId, useRef, useState, type DragEvent, type ReactNode } from 'react';
import { errorMessage, isAbort, resumableUpload, type UploadHandle, type UploadProgress } from '../api/client';
import { formatBytes } from '../format';
import { ProgressBar } from './common';

export type UploadRequest = { path: string; form: FormData } | { error: string };

type Uploader = <T>(path: string, form: FormData, onProgress?: (progress: UploadProgress) => void) => UploadHandle<T>;

interface UploadItem<T> {
  key: number;
  file: File;
  status: 'uploading' | 'done' | 'error' | 'canceled';
  loaded: number;
  total: number;
  error: string | null;
  result: T | null;
}

export interface UploadZoneProps<T> {
  /** What the files are, for the label: "ONNX model (.onnx or .zip)". */
  label: string;
  /** Lower-case extensions including the dot. */
  accept: string[];
  multiple?: boolean;
  buildRequest: (file: File) => UploadRequest;
  onUploaded?: (result: T, file: File) => void;
  describeResult?: (result: T) => ReactNode;
  disabled?: boolean;
  hint?: ReactNode;
  testId?: string;
  /** Injected in tests; defaults to the resumable (tus) uploader. */
  uploader?: Uploader;
  /** Turns the chosen files into the one file to upload (a folder of images into a zip, after a preview), or null to stop. */
  prepare?: (files: File[]) => Promise<File | null>;
  /** Offer a "Choose a folder" button too (every file under it goes to `prepare`). */
  folder?: boolean;
  /** Why `prepare` stopped, shown under the zone. */
  prepareError?: string | null;
}

let nextKey = 1;

export function hasAcceptedExtension(name: string, accept: string[]): boolean {
  const lower = name.toLowerCase();
  return accept.some((extension) => lower.endsWith(extension));
}

export function UploadZone<T>({
  label,
  accept,
  multiple = false,
  buildRequest,
  onUploaded,
  describeResult,
  disabled = false,
  hint,
  testId = 'upload',
  uploader = resumableUpload,
  prepare,
  folder = false,
  prepareError = null,
}: UploadZoneProps<T>) {
  const inputId = useId();
  const folderId = useId();
  const folderRef = useRef<HTMLInputElement>(null);
  const hintId = useId();
  const [items, setItems] = useState<UploadItem<T>[]>([]);
  const [dragging, setDragging] = useState(false);
  const handles = useRef(new Map<number, () => void>());
  const inputRef = useRef<HTMLInputElement>(null);

  // Leaving the page aborts uploads still in flight rather than letting them finish unseen.
  useEffect(() => {
    const current = handles.current;
    return () => current.forEach((abort) => abort());
  }, []);

  const update = (key: number, patch: Partial<UploadItem<T>>) =>
    setItems((previous) => previous.map((item) => (item.key === key ? { ...item, ...patch } : item)));

  const start = (file: File) => {
    const key = nextKey++;
    const item: UploadItem<T> = { key, file, status: 'uploading', loaded: 0, total: file.size, error: null, result: null };
    if (!hasAcceptedExtension(file.name, accept)) {
      item.status = 'error';
      item.error = `${file.name} is not a ${accept.join(' or ')} file.`;
      setItems((previous) => [item, ...previous]);
      return;
    }
    const request = buildRequest(file);
    if ('error' in request) {
      item.status = 'error';
      item.error = request.error;
      setItems((previous) => [item, ...previous]);
      return;
    }
    setItems((previous) => [item, ...previous]);
    const handle = uploader<T>(request.path, request.form, ({ loaded, total }) =>
      update(key, { loaded, total: total || file.size }),
    );
    handles.current.set(key, handle.abort);
    handle.promise
      .then((result) => {
        update(key, { status: 'done', result, loaded: file.size, total: file.size });
        onUploaded?.(result, file);
      })
      .catch((error: unknown) => {
        if (isAbort(error)) update(key, { status: 'canceled', error: null });
        else update(key, { status: 'error', error: errorMessage(error) });
      })
      .finally(() => handles.current.delete(key));
  };

  const startAll = (files: FileList | File[] | null) => {
    if (!files || disabled) return;
    const list = Array.from(files);
    if (inputRef.current) inputRef.current.value = '';
    if (folderRef.current) folderRef.current.value = '';
    if (prepare) {
      void prepare(list).then((file) => (file ? start(file) : undefined));
      return;
    }
    (multiple ? list : list.slice(0, 1)).forEach(start);
  };

  const onDrop = (event: DragEvent<HTMLDivElement>) => {
    event.preventDefault();
    setDragging(false);
    startAll(event.dataTransfer.files);
  };

  const cancel = (key: number) => handles.current.get(key)?.();
  const dismiss = (key: number) => setItems((previous) => previous.filter((item) => item.key !== key));

  return (
    <div className="upload" data-testid={testId}>
      <div
        className={`dropzone${dragging ? ' dropzone-active' : ''}${disabled ? ' dropzone-disabled' : ''}`}
        onDragOver={(event) => {
          event.preventDefault();
          if (!disabled) setDragging(true);
        }}
        onDragLeave={() => setDragging(false)}
        onDrop={onDrop}
        data-testid={`${testId}-dropzone`}
      >
        <p className="dropzone-title">Drop {multiple || prepare ? 'files' : 'a file'} here, or</p>
        <div className="button-row dropzone-buttons">
          <label htmlFor={inputId} className="button button-primary">
            Choose {multiple || prepare ? 'files' : 'a file'}
          </label>
          {folder ? (
            <label htmlFor={folderId} className="button">
              Choose a folder
            </label>
          ) : null}
        </div>
        {folder ? (
          <input
            id={folderId}
            ref={(element) => {
              folderRef.current = element;
              // Not a React attribute: the browser's folder picker.
              element?.setAttribute('webkitdirectory', '');
            }}
            className="visually-hidden"
            type="file"
            multiple
            disabled={disabled}
            aria-label={`${label}: a folder`}
            data-testid={`${testId}-folder-input`}
            onChange={(event) => startAll(event.target.files)}
          />
        ) : null}
        <input
          id={inputId}
          ref={inputRef}
          className="visually-hidden"
          type="file"
          accept={accept.join(',')}
          multiple={multiple || !!prepare}
          disabled={disabled}
          aria-label={label}
          aria-describedby={hintId}
          data-testid={`${testId}-input`}
          onChange={(event) => startAll(event.target.files)}
        />
        <p id={hintId} className="muted small">
          {label}
          {hint ? <> · {hint}</> : null}
        </p>
      </div>
      {prepareError ? (
        <p className="field-error" role="alert" data-testid={`${testId}-prepare-error`}>
          {prepareError}
        </p>
      ) : null}

      {items.length > 0 ? (
        <ul className="upload-list" aria-label="Uploads">
          {items.map((item) => (
            <li key={item.key} className={`upload-item upload-${item.status}`} data-testid="upload-item" data-status={item.status}>
              <div className="upload-row">
                <span className="upload-name" title={item.file.name}>
                  {item.file.name}
                </span>
                <span className="muted small">{formatBytes(item.file.size)}</span>
                <span className="upload-status small">
                  {item.status === 'uploading'
                    ? item.total && item.loaded >= item.total
                      ? 'Processing…'
                      : `${Math.round((item.loaded / (item.total || 1)) * 100)}%`
                    : item.status === 'done'
                      ? 'Uploaded'
                      : item.status === 'canceled'
                        ? 'Canceled'
                        : 'Failed'}
                </span>
                {item.status === 'uploading' ? (
                  <button
                    type="button"
                    className="button button-small"
                    onClick={() => cancel(item.key)}
                    aria-label={`Cancel upload of ${item.file.name}`}
                  >
                    Cancel
                  </button>
                ) : (
                  <button
                    type="button"
                    className="button button-small button-ghost"
                    onClick={() => dismiss(item.key)}
                    aria-label={`Dismiss ${item.file.name}`}
                  >
                    Dismiss
                  </button>
                )}
              </div>
              {item.status === 'uploading' ? (
                <ProgressBar
                  value={item.total ? item.loaded / item.total : null}
                  label={`Uploading ${item.file.name}`}
                  small
                />
              ) : null}
              {item.status === 'error' && item.error ? (
                <p className="upload-error" role="alert" data-testid="upload-error">
                  {item.error}
                </p>
              ) : null}
              {item.status === 'done' && item.result && describeResult ? (
                <div className="upload-result">{describeResult(item.result)}</div>
              ) : null}
            </li>
          ))}
        </ul>
      ) : null}
    </div>
  );
}

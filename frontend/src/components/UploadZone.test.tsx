import { act, render, screen, within } from '@testing-library/react';
import userEvent from '@testing-library/user-event';
import { describe, expect, it, vi } from 'vitest';
import { ApiError, type UploadProgress } from '../api/client';
import { UploadZone } from './UploadZone';

/** An uploader the test controls: progress, success, failure and abort by hand. */
function controlledUploader() {
  const calls: {
    path: string;
    form: FormData;
    progress: (p: UploadProgress) => void;
    resolve: (value: unknown) => void;
    reject: (error: unknown) => void;
    abort: ReturnType<typeof vi.fn>;
  }[] = [];
  const uploader = <T,>(path: string, form: FormData, onProgress?: (p: UploadProgress) => void) => {
    let resolve!: (value: unknown) => void;
    let reject!: (error: unknown) => void;
    const promise = new Promise<T>((res, rej) => {
      resolve = res as (value: unknown) => void;
      reject = rej;
    });
    const abort = vi.fn(() => reject(new DOMException('Upload canceled', 'AbortError')));
    calls.push({ path, form, progress: onProgress ?? (() => {}), resolve, reject, abort });
    return { promise, abort };
  };
  return { uploader, calls };
}

function renderZone(uploader: ReturnType<typeof controlledUploader>['uploader'], onUploaded = vi.fn()) {
  render(
    <UploadZone<{ id: number; name: string }>
      label="ONNX model"
      accept={['.onnx', '.zip']}
      uploader={uploader}
      buildRequest={(file) => {
        const form = new FormData();
        form.append('file', file);
        return { path: 'models/', form };
      }}
      onUploaded={onUploaded}
      describeResult={(model) => <span>Created {model.name}</span>}
    />,
  );
  return onUploaded;
}

const onnxFile = (name = 'digits.onnx', size = 1000) => new File([new Uint8Array(size)], name, { type: 'application/octet-stream' });

describe('UploadZone', () => {
  it('shows real upload progress and the result', async () => {
    const { uploader, calls } = controlledUploader();
    const onUploaded = renderZone(uploader);
    await userEvent.upload(screen.getByLabelText('ONNX model'), onnxFile());

    expect(calls).toHaveLength(1);
    expect(calls[0].path).toBe('models/');
    expect((calls[0].form.get('file') as File).name).toBe('digits.onnx');
    const item = screen.getByTestId('upload-item');
    const bar = within(item).getByRole('progressbar', { name: 'Uploading digits.onnx' });
    expect(bar).toHaveAttribute('aria-valuenow', '0');

    act(() => calls[0].progress({ loaded: 400, total: 1000 }));
    expect(bar).toHaveAttribute('aria-valuenow', '40');
    expect(within(item).getByText('40%')).toBeInTheDocument();

    await act(async () => calls[0].resolve({ id: 1, name: 'digits' }));
    expect(item).toHaveAttribute('data-status', 'done');
    expect(within(item).getByText('Created digits')).toBeInTheDocument();
    expect(within(item).queryByRole('progressbar')).not.toBeInTheDocument();
    expect(onUploaded).toHaveBeenCalledWith({ id: 1, name: 'digits' }, expect.any(File));
  });

  it('cancels an upload in flight', async () => {
    const { uploader, calls } = controlledUploader();
    const onUploaded = renderZone(uploader);
    await userEvent.upload(screen.getByLabelText('ONNX model'), onnxFile('big.onnx'));
    act(() => calls[0].progress({ loaded: 100, total: 1000 }));

    await userEvent.click(screen.getByRole('button', { name: 'Cancel upload of big.onnx' }));
    expect(calls[0].abort).toHaveBeenCalledTimes(1);
    const item = screen.getByTestId('upload-item');
    expect(item).toHaveAttribute('data-status', 'canceled');
    expect(within(item).getByText('Canceled')).toBeInTheDocument();
    expect(within(item).queryByRole('alert')).not.toBeInTheDocument();
    expect(onUploaded).not.toHaveBeenCalled();
  });

  it("shows the server's error next to the file", async () => {
    const { uploader, calls } = controlledUploader();
    renderZone(uploader);
    await userEvent.upload(screen.getByLabelText('ONNX model'), onnxFile('bad.onnx'));
    await act(async () =>
      calls[0].reject(new ApiError('bad.onnx is not an ONNX model: could not parse the protobuf.', 400, 'invalid_model')),
    );
    const item = screen.getByTestId('upload-item');
    expect(item).toHaveAttribute('data-status', 'error');
    expect(within(item).getByText('bad.onnx')).toBeInTheDocument();
    expect(within(item).getByRole('alert')).toHaveTextContent('bad.onnx is not an ONNX model: could not parse the protobuf.');
  });

  it('rejects a file with the wrong extension without uploading it', async () => {
    const { uploader, calls } = controlledUploader();
    renderZone(uploader);
    await userEvent.upload(screen.getByLabelText('ONNX model'), onnxFile('notes.txt'), { applyAccept: false });
    expect(calls).toHaveLength(0);
    expect(screen.getByRole('alert')).toHaveTextContent('notes.txt is not a .onnx or .zip file.');
  });

  it('accepts a dropped file', async () => {
    const { uploader, calls } = controlledUploader();
    renderZone(uploader);
    const file = onnxFile('dropped.onnx');
    const dropzone = screen.getByTestId('upload-dropzone');
    const { fireEvent } = await import('@testing-library/react');
    fireEvent.drop(dropzone, { dataTransfer: { files: [file] } });
    expect(calls).toHaveLength(1);
    expect(screen.getByText('dropped.onnx')).toBeInTheDocument();
  });
});

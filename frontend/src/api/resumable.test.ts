import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { resumableUpload, UPLOAD_CHUNK_BYTES } from './client';

/** A tus server in memory behind a fake XMLHttpRequest; `dropNextPatch` breaks one chunk's connection half-way. */
const server = { data: 0, length: 0, dropNextPatch: false, requests: [] as { method: string; offset: string | null; size: number }[] };

class TusXhr {
  method = '';
  url = '';
  headers: Record<string, string> = {};
  status = 0;
  statusText = '';
  responseText = '';
  withCredentials = false;
  responseHeaders: Record<string, string> = {};
  upload: { onprogress: ((event: ProgressEvent) => void) | null } = { onprogress: null };
  onload: (() => void) | null = null;
  onerror: (() => void) | null = null;
  onabort: (() => void) | null = null;
  open(method: string, url: string) {
    this.method = method;
    this.url = url;
  }
  setRequestHeader(name: string, value: string) {
    this.headers[name] = value;
  }
  getResponseHeader(name: string) {
    return this.responseHeaders[name] ?? null;
  }
  abort() {
    this.onabort?.();
  }
  send(body: Blob | null) {
    const size = body ? body.size : 0;
    server.requests.push({ method: this.method, offset: this.headers['Upload-Offset'] ?? null, size });
    queueMicrotask(() => {
      if (this.method === 'POST') {
        server.length = Number(this.headers['Upload-Length']);
        this.answer(201, { id: 'u1', url: '/api/v1/uploads/u1/' }, { Location: '/api/v1/uploads/u1/' });
      } else if (this.method === 'HEAD') {
        this.answer(200, '', { 'Upload-Offset': String(server.data) });
      } else if (Number(this.headers['Upload-Offset']) !== server.data) {
        this.answer(409, { error: 'offset', code: 'offset_mismatch' });
      } else if (server.dropNextPatch) {
        server.dropNextPatch = false;
        server.data += Math.floor(size / 2);
        this.onerror?.();
      } else {
        server.data += size;
        this.upload.onprogress?.({ loaded: size, total: size, lengthComputable: true } as ProgressEvent);
        this.answer(204, '', { 'Upload-Offset': String(server.data) });
      }
    });
  }
  answer(status: number, body: unknown, headers: Record<string, string> = {}) {
    this.status = status;
    this.responseText = typeof body === 'string' ? body : JSON.stringify(body);
    this.responseHeaders = headers;
    this.onload?.();
  }
}

describe('resumableUpload', () => {
  const fetchMock = vi.fn<typeof fetch>();
  beforeEach(() => {
    Object.assign(server, { data: 0, length: 0, dropNextPatch: false, requests: [] });
    vi.stubGlobal('XMLHttpRequest', TusXhr);
    vi.stubGlobal('fetch', fetchMock);
    vi.spyOn(Math, 'random').mockReturnValue(0);
    fetchMock.mockReset();
    document.cookie = 'csrftoken=tok; path=/';
    fetchMock.mockImplementation(async () => new Response(JSON.stringify({ id: 7, name: 'big' }), { status: 201 }));
  });
  afterEach(() => vi.unstubAllGlobals());

  it('sends the file in chunks, resumes a dropped one from the server offset, then names the upload', async () => {
    const file = new File([new Uint8Array(UPLOAD_CHUNK_BYTES * 2 + 10)], 'big.onnx');
    const form = new FormData();
    form.append('name', 'big');
    form.append('file', file);
    server.dropNextPatch = true;
    const progress = vi.fn();
    const result = await resumableUpload<{ id: number }>('models/', form, progress).promise;
    expect(result).toEqual({ id: 7, name: 'big' });
    expect(server.data).toBe(file.size);
    const patches = server.requests.filter((request) => request.method === 'PATCH').map((request) => Number(request.offset));
    // The first chunk broke half-way: the next one starts where the server stood, not at 0 or at a full chunk.
    expect(patches[1]).toBe(UPLOAD_CHUNK_BYTES / 2);
    expect(server.requests.some((request) => request.method === 'HEAD')).toBe(true);
    expect(progress).toHaveBeenLastCalledWith({ loaded: file.size, total: file.size });
    const [url, init] = fetchMock.mock.calls[0];
    expect(url).toBe('/api/v1/models/');
    expect(JSON.parse(String(init?.body))).toEqual({ name: 'big', upload: 'u1' });
  });

  it('stops with the server message on a 4xx', async () => {
    fetchMock.mockImplementation(async () => new Response(JSON.stringify({ error: 'This is not a valid ONNX model: x', code: 'invalid_model' }), { status: 400 }));
    const form = new FormData();
    form.append('file', new File([new Uint8Array(10)], 'bad.onnx'));
    await expect(resumableUpload('models/', form).promise).rejects.toMatchObject({ code: 'invalid_model' });
  });
});

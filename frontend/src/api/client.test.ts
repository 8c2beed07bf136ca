import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { api, ApiError, ensureCsrf, errorFromResponse, uploadWithProgress } from './client';

function jsonResponse(status: number, body: unknown, statusText = ''): Response {
  return new Response(body === null ? null : JSON.stringify(body), {
    status,
    statusText,
    headers: { 'Content-Type': 'application/json' },
  });
}

describe('errorFromResponse', () => {
  it('uses the server error message and code', () => {
    const error = errorFromResponse(400, 'Bad Request', JSON.stringify({ error: 'Not an ONNX model: protobuf parse failed', code: 'invalid_model' }));
    expect(error).toBeInstanceOf(ApiError);
    expect(error.message).toBe('Not an ONNX model: protobuf parse failed');
    expect(error.code).toBe('invalid_model');
    expect(error.status).toBe(400);
  });

  it('falls back to human words for a non-JSON 5xx page', () => {
    const error = errorFromResponse(502, 'Bad Gateway', '<html>nginx</html>');
    expect(error.message).toMatch(/server had a problem \(502 Bad Gateway\)/);
  });

  it('explains an upload that is too large even without a message', () => {
    expect(errorFromResponse(413, '', JSON.stringify({ code: 'upload_too_large' })).message).toMatch(/larger than this server accepts/);
    expect(errorFromResponse(413, '', '').code).toBe('upload_too_large');
  });

  it('recognises a Django CSRF failure page', () => {
    const error = errorFromResponse(403, 'Forbidden', '<h1>Forbidden</h1><p>CSRF verification failed.</p>');
    expect(error.code).toBe('csrf_failed');
  });
});

describe('api', () => {
  const fetchMock = vi.fn<typeof fetch>();
  beforeEach(() => {
    vi.stubGlobal('fetch', fetchMock);
    fetchMock.mockReset();
  });
  afterEach(() => vi.unstubAllGlobals());

  it('sends the csrftoken cookie as X-CSRFToken on unsafe methods, with same-origin credentials', async () => {
    document.cookie = 'csrftoken=abc123; path=/';
    fetchMock.mockResolvedValueOnce(jsonResponse(201, { id: 4 }));
    const result = await api<{ id: number }>('tokens/', { method: 'POST', body: { name: 'ci' } });
    expect(result).toEqual({ id: 4 });
    const [url, init] = fetchMock.mock.calls[0];
    expect(url).toBe('/api/v1/tokens/');
    expect(init?.credentials).toBe('same-origin');
    expect((init?.headers as Record<string, string>)['X-CSRFToken']).toBe('abc123');
    expect(init?.body).toBe(JSON.stringify({ name: 'ci' }));
  });

  it('does not send the CSRF header on GET', async () => {
    document.cookie = 'csrftoken=abc123; path=/';
    fetchMock.mockResolvedValueOnce(jsonResponse(200, []));
    await api('models/');
    expect((fetchMock.mock.calls[0][1]?.headers as Record<string, string>)['X-CSRFToken']).toBeUndefined();
  });

  it('fetches the CSRF cookie first when it is missing', async () => {
    fetchMock.mockImplementationOnce(async () => {
      document.cookie = 'csrftoken=fresh; path=/';
      return jsonResponse(200, { csrf_token: 'fresh' });
    });
    fetchMock.mockResolvedValueOnce(jsonResponse(200, { ok: true }));
    await api('auth/login/', { method: 'POST', body: { username: 'a', password: 'b' } });
    expect(fetchMock.mock.calls[0][0]).toBe('/api/v1/auth/csrf/');
    expect((fetchMock.mock.calls[1][1]?.headers as Record<string, string>)['X-CSRFToken']).toBe('fresh');
  });

  it('retries once with a fresh token after a CSRF failure', async () => {
    document.cookie = 'csrftoken=stale; path=/';
    fetchMock
      .mockResolvedValueOnce(new Response('CSRF verification failed', { status: 403 }))
      .mockImplementationOnce(async () => {
        document.cookie = 'csrftoken=renewed; path=/';
        return jsonResponse(200, { csrf_token: 'renewed' });
      })
      .mockResolvedValueOnce(jsonResponse(200, { id: 1 }));
    await expect(api('jobs/1/cancel/', { method: 'POST' })).resolves.toEqual({ id: 1 });
    expect(fetchMock).toHaveBeenCalledTimes(3);
    expect((fetchMock.mock.calls[2][1]?.headers as Record<string, string>)['X-CSRFToken']).toBe('renewed');
  });

  it('throws ApiError with the server message on 4xx', async () => {
    fetchMock.mockResolvedValueOnce(jsonResponse(404, { error: 'Model 9 not found.', code: 'not_found' }));
    await expect(api('models/9/')).rejects.toMatchObject({ message: 'Model 9 not found.', status: 404, code: 'not_found' });
  });

  it('turns a network failure into words', async () => {
    fetchMock.mockRejectedValueOnce(new TypeError('Failed to fetch'));
    await expect(api('models/')).rejects.toMatchObject({ status: 0, code: 'network_error', message: expect.stringMatching(/Could not reach/) });
  });

  it('returns null for 204', async () => {
    document.cookie = 'csrftoken=x; path=/';
    fetchMock.mockResolvedValueOnce(new Response(null, { status: 204 }));
    await expect(api('auth/logout/', { method: 'POST' })).resolves.toBeNull();
  });

  it('ensureCsrf keeps the token from the body when the cookie is unreadable', async () => {
    fetchMock.mockResolvedValueOnce(jsonResponse(200, { csrf_token: 'from-body' }));
    await expect(ensureCsrf(true)).resolves.toBe('from-body');
  });
});

/** A stand-in XMLHttpRequest that the test drives by hand. */
class FakeXhr {
  static last: FakeXhr;
  method = '';
  url = '';
  headers: Record<string, string> = {};
  status = 0;
  statusText = '';
  responseText = '';
  withCredentials = false;
  body: unknown = null;
  upload: { onprogress: ((event: ProgressEvent) => void) | null } = { onprogress: null };
  onload: (() => void) | null = null;
  onerror: (() => void) | null = null;
  onabort: (() => void) | null = null;
  constructor() {
    FakeXhr.last = this;
  }
  open(method: string, url: string) {
    this.method = method;
    this.url = url;
  }
  setRequestHeader(name: string, value: string) {
    this.headers[name] = value;
  }
  send(body: unknown) {
    this.body = body;
  }
  abort() {
    this.onabort?.();
  }
  respond(status: number, body: unknown) {
    this.status = status;
    this.responseText = typeof body === 'string' ? body : JSON.stringify(body);
    this.onload?.();
  }
}

describe('uploadWithProgress', () => {
  beforeEach(() => vi.stubGlobal('XMLHttpRequest', FakeXhr));
  afterEach(() => vi.unstubAllGlobals());

  it('posts with the CSRF header, reports progress and resolves with the JSON body', async () => {
    document.cookie = 'csrftoken=tok; path=/';
    const progress = vi.fn();
    const form = new FormData();
    const handle = uploadWithProgress<{ id: number }>('models/', form, progress);
    const xhr = FakeXhr.last;
    expect(xhr.method).toBe('POST');
    expect(xhr.url).toBe('/api/v1/models/');
    expect(xhr.headers['X-CSRFToken']).toBe('tok');
    expect(xhr.body).toBe(form);
    xhr.upload.onprogress?.({ loaded: 50, total: 200, lengthComputable: true } as ProgressEvent);
    expect(progress).toHaveBeenCalledWith({ loaded: 50, total: 200 });
    xhr.respond(201, { id: 3 });
    await expect(handle.promise).resolves.toEqual({ id: 3 });
  });

  it('rejects with the server message', async () => {
    const handle = uploadWithProgress('models/', new FormData());
    FakeXhr.last.respond(400, { error: 'The file is not a valid ONNX model.', code: 'invalid_model' });
    await expect(handle.promise).rejects.toMatchObject({ message: 'The file is not a valid ONNX model.', code: 'invalid_model' });
  });

  it('rejects with an AbortError when aborted', async () => {
    const handle = uploadWithProgress('models/', new FormData());
    handle.abort();
    await expect(handle.promise).rejects.toMatchObject({ name: 'AbortError' });
  });
});

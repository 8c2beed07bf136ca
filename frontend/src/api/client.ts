/**
 * The one way the UI talks to the Kiln API: same-origin session cookies, the CSRF header on
 * unsafe methods, and every failure turned into an ApiError carrying the server's message.
 */

export const API_BASE = '/api/v1/';

export class ApiError extends Error {
  readonly status: number;
  readonly code: string | null;
  readonly details: unknown;

  constructor(message: string, status: number, code: string | null = null, details: unknown = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/** The token the server gave us last, for when the cookie cannot be read. */
let csrfFallback: string | null = null;

export function readCookie(name: string): string | null {
  for (const part of document.cookie ? document.cookie.split(';') : []) {
    const [key, ...rest] = part.trim().split('=');
    if (key === name) return decodeURIComponent(rest.join('='));
  }
  return null;
}

/**
 * The current CSRF token. The cookie wins because Django rotates the token at sign-in and
 * only the cookie follows the rotation.
 */
export function csrfToken(): string | null {
  return readCookie('csrftoken') ?? csrfFallback;
}

/** Asks the server to set the csrftoken cookie; call once at start and after a CSRF failure. */
export async function ensureCsrf(force = false): Promise<string | null> {
  if (!force && readCookie('csrftoken')) return readCookie('csrftoken');
  try {
    const response = await fetch(`${API_BASE}auth/csrf/`, { credentials: 'same-origin' });
    if (response.ok) {
      const body = (await response.json().catch(() => null)) as { csrf_token?: string } | null;
      if (body?.csrf_token) csrfFallback = body.csrf_token;
    }
  } catch {
    // The request that needs the token reports the network failure in words.
  }
  return csrfToken();
}

export function apiUrl(path: string): string {
  if (path.startsWith('/')) return path;
  return API_BASE + path;
}

const STATUS_MESSAGES: Record<number, string> = {
  400: 'The server could not accept that request.',
  401: 'Please sign in again.',
  403: 'You do not have permission to do that.',
  404: 'That item does not exist, or it belongs to another organization.',
  409: 'That conflicts with the current state. Reload and try again.',
  413: 'The file is larger than this server accepts.',
  429: 'Too many requests. Wait a moment and try again.',
};

/** Builds an ApiError from a failed response's status and (possibly non-JSON) body text. */
export function errorFromResponse(status: number, statusText: string, bodyText: string): ApiError {
  let body: unknown = null;
  try {
    body = bodyText ? JSON.parse(bodyText) : null;
  } catch {
    body = null;
  }
  if (body && typeof body === 'object') {
    const record = body as Record<string, unknown>;
    const code = typeof record.code === 'string' ? record.code : null;
    if (typeof record.error === 'string' && record.error) {
      return new ApiError(record.error, status, code, record.details ?? null);
    }
    // Framework-default shapes ({"detail": "..."}) still deserve their words on screen.
    if (typeof record.detail === 'string' && record.detail) {
      return new ApiError(record.detail, status, code, record.details ?? null);
    }
    if (code === 'upload_too_large') return new ApiError(STATUS_MESSAGES[413], status, code);
  }
  if (status === 403 && /csrf/i.test(bodyText)) {
    return new ApiError('Your session expired. Reload the page and try again.', status, 'csrf_failed');
  }
  const fallback =
    STATUS_MESSAGES[status] ??
    (status >= 500
      ? `The server had a problem (${status}${statusText ? ` ${statusText}` : ''}). Try again in a moment.`
      : `The request failed (${status}${statusText ? ` ${statusText}` : ''}).`);
  return new ApiError(fallback, status, status === 413 ? 'upload_too_large' : null);
}

export const NETWORK_ERROR_MESSAGE = 'Could not reach the Kiln server. Check your connection and try again.';

export interface RequestOptions {
  method?: string;
  body?: unknown;
  signal?: AbortSignal;
}

/** Sends a JSON request and returns the parsed answer (null for 204). Throws ApiError. */
export async function api<T>(path: string, options: RequestOptions = {}): Promise<T> {
  const method = (options.method ?? 'GET').toUpperCase();
  const send = async (): Promise<Response> => {
    const headers: Record<string, string> = { Accept: 'application/json' };
    if (options.body !== undefined) headers['Content-Type'] = 'application/json';
    if (!SAFE_METHODS.has(method)) {
      const token = csrfToken() ?? (await ensureCsrf());
      if (token) headers['X-CSRFToken'] = token;
    }
    try {
      return await fetch(apiUrl(path), {
        method,
        headers,
        credentials: 'same-origin',
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
        signal: options.signal,
      });
    } catch (error) {
      if (error instanceof DOMException && error.name === 'AbortError') throw error;
      throw new ApiError(NETWORK_ERROR_MESSAGE, 0, 'network_error');
    }
  };

  let response = await send();
  let text = await response.text();
  if (!response.ok && response.status === 403 && !SAFE_METHODS.has(method) && /csrf/i.test(text)) {
    // A stale or missing CSRF cookie: fetch a fresh one and try exactly once more.
    await ensureCsrf(true);
    response = await send();
    text = await response.text();
  }
  if (!response.ok) throw errorFromResponse(response.status, response.statusText, text);
  if (response.status === 204 || !text) return null as T;
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new ApiError('The server sent an answer the UI could not read.', response.status, 'bad_response');
  }
}

export function errorMessage(error: unknown): string {
  if (!error) return '';
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) return error.message;
  return String(error);
}

export interface UploadHandle<T> {
  promise: Promise<T>;
  abort: () => void;
}

export interface UploadProgress {
  loaded: number;
  total: number;
}

/**
 * Posts multipart form data with XMLHttpRequest, because fetch cannot report upload progress.
 * The promise rejects with ApiError (server message), or with an AbortError after abort().
 */
export function uploadWithProgress<T>(
  path: string,
  form: FormData,
  onProgress?: (progress: UploadProgress) => void,
): UploadHandle<T> {
  const xhr = new XMLHttpRequest();
  const promise = new Promise<T>((resolve, reject) => {
    xhr.open('POST', apiUrl(path));
    xhr.withCredentials = true;
    xhr.setRequestHeader('Accept', 'application/json');
    const token = csrfToken();
    if (token) xhr.setRequestHeader('X-CSRFToken', token);
    xhr.upload.onprogress = (event) => {
      if (onProgress) onProgress({ loaded: event.loaded, total: event.lengthComputable ? event.total : 0 });
    };
    xhr.onload = () => {
      const text = typeof xhr.responseText === 'string' ? xhr.responseText : '';
      if (xhr.status >= 200 && xhr.status < 300) {
        try {
          resolve((text ? JSON.parse(text) : null) as T);
        } catch {
          reject(new ApiError('The server sent an answer the UI could not read.', xhr.status, 'bad_response'));
        }
      } else {
        reject(errorFromResponse(xhr.status, xhr.statusText, text));
      }
    };
    xhr.onerror = () => reject(new ApiError(NETWORK_ERROR_MESSAGE, 0, 'network_error'));
    xhr.onabort = () => reject(new DOMException('Upload canceled', 'AbortError'));
    xhr.send(form);
  });
  return { promise, abort: () => xhr.abort() };
}

export function isAbort(error: unknown): boolean {
  return error instanceof DOMException && error.name === 'AbortError';
}

/** Bytes per PATCH of a resumable upload: small enough that a dropped connection costs little. */
export const UPLOAD_CHUNK_BYTES = 8 * 1024 * 1024;
const UPLOAD_MAX_FAILURES = 6;

function base64Text(text: string): string {
  const bytes = new TextEncoder().encode(text);
  let binary = '';
  bytes.forEach((byte) => {
    binary += String.fromCharCode(byte);
  });
  return btoa(binary);
}

interface XhrResult {
  status: number;
  text: string;
  header: (name: string) => string | null;
}

/** One XMLHttpRequest as a promise: resolves on 2xx, rejects with ApiError (or AbortError). */
function xhrSend(
  method: string,
  url: string,
  body: Blob | null,
  headers: Record<string, string>,
  register: (xhr: XMLHttpRequest) => void,
  onProgress?: (loaded: number) => void,
): Promise<XhrResult> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    register(xhr);
    xhr.open(method, url);
    xhr.withCredentials = true;
    xhr.setRequestHeader('Accept', 'application/json');
    xhr.setRequestHeader('Tus-Resumable', '1.0.0');
    const token = csrfToken();
    if (token && !SAFE_METHODS.has(method)) xhr.setRequestHeader('X-CSRFToken', token);
    Object.entries(headers).forEach(([name, value]) => xhr.setRequestHeader(name, value));
    if (onProgress) xhr.upload.onprogress = (event) => onProgress(event.loaded);
    xhr.onload = () => {
      const text = typeof xhr.responseText === 'string' ? xhr.responseText : '';
      if (xhr.status >= 200 && xhr.status < 300) resolve({ status: xhr.status, text, header: (name) => xhr.getResponseHeader(name) });
      else reject(errorFromResponse(xhr.status, xhr.statusText, text));
    };
    xhr.onerror = () => reject(new ApiError(NETWORK_ERROR_MESSAGE, 0, 'network_error'));
    xhr.onabort = () => reject(new DOMException('Upload canceled', 'AbortError'));
    xhr.send(body);
  });
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Sends the form's `file` as a resumable upload (tus: chunks at offsets), then posts the other
 * form fields with the finished upload's id as JSON to `path`. A dropped chunk is resumed from
 * the offset the server reports, with backoff, so a flaky connection does not lose a large file.
 */
export function resumableUpload<T>(
  path: string,
  form: FormData,
  onProgress?: (progress: UploadProgress) => void,
): UploadHandle<T> {
  let current: XMLHttpRequest | null = null;
  let aborted = false;
  const controller = new AbortController();
  const register = (xhr: XMLHttpRequest) => {
    current = xhr;
  };
  const promise = (async () => {
    const file = form.get('file');
    if (!(file instanceof Blob)) throw new ApiError('No file to upload.', 400, 'invalid');
    const name = file instanceof File ? file.name : 'upload.bin';
    const fields: Record<string, string> = {};
    form.forEach((value, key) => {
      if (key !== 'file' && typeof value === 'string') fields[key] = value;
    });
    const created = await xhrSend('POST', apiUrl('uploads/'), null, { 'Upload-Length': String(file.size), 'Upload-Metadata': `filename ${base64Text(name)}` }, register);
    const upload = JSON.parse(created.text) as { id: string; url: string };
    const location = created.header('Location') ?? upload.url;
    let offset = 0;
    let failures = 0;
    onProgress?.({ loaded: 0, total: file.size });
    while (offset < file.size) {
      if (aborted) throw new DOMException('Upload canceled', 'AbortError');
      const start = offset;
      const chunk = file.slice(start, start + UPLOAD_CHUNK_BYTES);
      try {
        const answer = await xhrSend('PATCH', location, chunk, { 'Upload-Offset': String(start), 'Content-Type': 'application/offset+octet-stream' }, register,
          (loaded) => onProgress?.({ loaded: start + loaded, total: file.size }));
        offset = Number(answer.header('Upload-Offset') ?? start + chunk.size);
        failures = 0;
      } catch (error) {
        const retryable = error instanceof ApiError && (error.status === 0 || error.status >= 500 || error.status === 409 || error.status === 423 || error.code === 'chunk_interrupted');
        if (!retryable || ++failures > UPLOAD_MAX_FAILURES) throw error;
        await sleep(Math.min(30_000, 500 * 2 ** failures) * Math.random());
        const where = await xhrSend('HEAD', location, null, {}, register);
        offset = Number(where.header('Upload-Offset') ?? start);
      }
    }
    onProgress?.({ loaded: file.size, total: file.size });
    return api<T>(path, { method: 'POST', body: { ...fields, upload: upload.id }, signal: controller.signal });
  })();
  return {
    promise,
    abort: () => {
      aborted = true;
      (current as XMLHttpRequest | null)?.abort();
      controller.abort();
    },
  };
}

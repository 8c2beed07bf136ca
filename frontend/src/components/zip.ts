/**
 * A folder of images, packed in the browser into the zip the server's recipes read (files stored as they are:
 * JPEG and PNG do not compress further). Class folders are kept as paths, so they become labels.
 */

const RAW_SUFFIXES = ['.jpg', '.jpeg', '.png', '.wav'];
// Zip's 32-bit sizes and offsets: past them a zip needs ZIP64, which this writer does not do.
const MAX_ZIP_BYTES = 0xffff_fff0;

let table: Uint32Array | null = null;

export function crc32(data: Uint8Array): number {
  if (!table) {
    table = new Uint32Array(256);
    for (let n = 0; n < 256; n += 1) {
      let c = n;
      for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
  }
  let crc = 0xffffffff;
  for (const byte of data) crc = table[(crc ^ byte) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

export interface ZipEntry {
  name: string;
  data: Uint8Array;
}

/** A stored (uncompressed) zip of the entries. */
export function zipEntries(entries: ZipEntry[]): Blob {
  const encoder = new TextEncoder();
  const parts: BlobPart[] = [];
  const central: Uint8Array<ArrayBuffer>[] = [];
  let offset = 0;
  for (const entry of entries) {
    const name = encoder.encode(entry.name);
    const crc = crc32(entry.data);
    const local = new DataView(new ArrayBuffer(30));
    local.setUint32(0, 0x04034b50, true);
    local.setUint16(4, 20, true);
    local.setUint16(6, 0x0800, true); // UTF-8 names
    local.setUint32(14, crc, true);
    local.setUint32(18, entry.data.length, true);
    local.setUint32(22, entry.data.length, true);
    local.setUint16(26, name.length, true);
    parts.push(local.buffer, name as Uint8Array<ArrayBuffer>, entry.data as Uint8Array<ArrayBuffer>);
    const header = new DataView(new ArrayBuffer(46));
    header.setUint32(0, 0x02014b50, true);
    header.setUint16(4, 20, true);
    header.setUint16(6, 20, true);
    header.setUint16(8, 0x0800, true);
    header.setUint32(16, crc, true);
    header.setUint32(20, entry.data.length, true);
    header.setUint32(24, entry.data.length, true);
    header.setUint16(28, name.length, true);
    header.setUint32(42, offset, true);
    const record = new Uint8Array(46 + name.length);
    record.set(new Uint8Array(header.buffer), 0);
    record.set(name, 46);
    central.push(record);
    offset += 30 + name.length + entry.data.length;
    if (offset > MAX_ZIP_BYTES) throw new Error('These files hold more than 4 GB: zip them yourself (with ZIP64) and upload the zip.');
  }
  const size = central.reduce((sum, record) => sum + record.length, 0);
  const end = new DataView(new ArrayBuffer(22));
  end.setUint32(0, 0x06054b50, true);
  end.setUint16(8, entries.length, true);
  end.setUint16(10, entries.length, true);
  end.setUint32(12, size, true);
  end.setUint32(16, offset, true);
  return new Blob([...parts, ...central, end.buffer], { type: 'application/zip' });
}

export function isRawFile(name: string): boolean {
  const lower = name.toLowerCase();
  return RAW_SUFFIXES.some((suffix) => lower.endsWith(suffix)) && !lower.split('/').some((part) => part.startsWith('.'));
}

/**
 * Each chosen file's name inside the zip: its path under the chosen folder (`cat/1.jpg`), so that class folders become
 * labels; files picked one by one keep their plain names.
 */
export function entryName(file: File): string {
  const relative = (file as File & { webkitRelativePath?: string }).webkitRelativePath || file.name;
  const parts = relative.split('/');
  return parts.length > 1 ? parts.slice(1).join('/') : parts[0];
}

/** The raw files among those chosen (or `only` these of them), packed into one zip named for their folder. */
export async function packFiles(files: File[], only?: File[]): Promise<File> {
  const chosen = (only ?? files).filter((file) => isRawFile(entryName(file))).sort((a, b) => entryName(a).localeCompare(entryName(b)));
  const entries = await Promise.all(chosen.map(async (file) => ({ name: entryName(file), data: new Uint8Array(await file.arrayBuffer()) })));
  const folder = ((files[0] as File & { webkitRelativePath?: string }).webkitRelativePath || '').split('/')[0] || 'images';
  return new File([zipEntries(entries)], `${folder}.zip`, { type: 'application/zip' });
}

export function countRawFiles(files: File[]): number {
  return files.filter((file) => isRawFile(entryName(file))).length;
}

/** A blob's bytes (FileReader: jsdom's Blob has no arrayBuffer()). */
export function readBytes(blob: Blob): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(new Uint8Array(reader.result as ArrayBuffer));
    reader.onerror = () => reject(reader.error);
    reader.readAsArrayBuffer(blob);
  });
}

// The end-of-central-directory record is 22 bytes plus a comment of at most 65535.
const EOCD_SEARCH = 22 + 0xffff;

/** The entry names of a zip the user chose, from its central directory (nothing else is read); [] when it is not a zip. */
export async function zipEntryNames(file: Blob): Promise<string[]> {
  const tailStart = Math.max(0, file.size - EOCD_SEARCH);
  const tail = await readBytes(file.slice(tailStart));
  const view = new DataView(tail.buffer, tail.byteOffset, tail.byteLength);
  let end = -1;
  for (let at = tail.length - 22; at >= 0; at -= 1) {
    if (view.getUint32(at, true) === 0x06054b50) {
      end = at;
      break;
    }
  }
  if (end < 0) return [];
  const count = view.getUint16(end + 10, true);
  const size = view.getUint32(end + 12, true);
  const offset = view.getUint32(end + 16, true);
  // A ZIP64 archive marks these as 0xFFFF.../0xFFFFFFFF; its names are not needed badly enough to parse ZIP64 here.
  if (offset === 0xffffffff || size === 0xffffffff) return [];
  const directory = await readBytes(file.slice(offset, offset + size));
  const entries = new DataView(directory.buffer, directory.byteOffset, directory.byteLength);
  const decoder = new TextDecoder();
  const names: string[] = [];
  for (let at = 0, index = 0; index < count && at + 46 <= directory.length; index += 1) {
    if (entries.getUint32(at, true) !== 0x02014b50) break;
    const nameLength = entries.getUint16(at + 28, true);
    const extra = entries.getUint16(at + 30, true);
    const comment = entries.getUint16(at + 32, true);
    names.push(decoder.decode(directory.subarray(at + 46, at + 46 + nameLength)));
    at += 46 + nameLength + extra + comment;
  }
  return names;
}

// Files packed for a preview: the first of each class folder (up to this many folders) and the first few overall; the
// server chooses among them what to show (workers/raw_datasets.py preview_members).
const PREVIEW_FOLDERS = 8;
const PREVIEW_FIRST = 4;

/** The few files of a folder that a preview needs: the first of each class folder, and the first ones overall. */
export function previewFiles(files: File[]): File[] {
  const raw = files.filter((file) => isRawFile(entryName(file))).sort((a, b) => entryName(a).localeCompare(entryName(b)));
  const chosen = new Set(raw.slice(0, PREVIEW_FIRST));
  const folders = new Set<string>();
  for (const file of raw) {
    const folder = entryName(file).split('/').slice(0, -1).join('/');
    if (folder && !folders.has(folder) && folders.size < PREVIEW_FOLDERS) {
      folders.add(folder);
      chosen.add(file);
    }
  }
  return raw.filter((file) => chosen.has(file));
}

/** The hex SHA-256 of a blob, as the server names uploads; null where the browser offers no digest (not a secure context). */
export async function sha256Hex(blob: Blob): Promise<string | null> {
  if (!globalThis.crypto?.subtle) return null;
  const digest = await globalThis.crypto.subtle.digest('SHA-256', (await readBytes(blob)) as Uint8Array<ArrayBuffer>);
  return [...new Uint8Array(digest)].map((byte) => byte.toString(16).padStart(2, '0')).join('');
}

import { describe, expect, it } from 'vitest';
import { crc32, entryName, isRawFile, previewFiles, zipEntries, zipEntryNames } from './zip';

describe('zip of a folder of images', () => {
  it('computes the CRC-32 zip readers check', () => {
    expect(crc32(new TextEncoder().encode('hello'))).toBe(0x3610a686);
  });

  it('writes a stored zip whose directory lists every entry with its size', async () => {
    const data = new TextEncoder().encode('jpeg bytes');
    const blob = zipEntries([{ name: 'cat/1.jpg', data }, { name: 'dog/2.jpg', data }]);
    // jsdom's Blob has no arrayBuffer(); its FileReader reads one.
    const bytes = await new Promise<Uint8Array>((resolve) => {
      const reader = new FileReader();
      reader.onload = () => resolve(new Uint8Array(reader.result as ArrayBuffer));
      reader.readAsArrayBuffer(blob);
    });
    const view = new DataView(bytes.buffer);
    expect(view.getUint32(0, true)).toBe(0x04034b50);
    const end = bytes.length - 22;
    expect(view.getUint32(end, true)).toBe(0x06054b50);
    expect(view.getUint16(end + 10, true)).toBe(2);
    const central = view.getUint32(end + 16, true);
    expect(view.getUint32(central, true)).toBe(0x02014b50);
    expect(view.getUint32(central + 24, true)).toBe(data.length);
    expect(new TextDecoder().decode(bytes.slice(central + 46, central + 46 + 9))).toBe('cat/1.jpg');
  });

  it('keeps class folders under the chosen folder and skips hidden and other files', () => {
    const file = new File(['x'], '1.jpg');
    Object.defineProperty(file, 'webkitRelativePath', { value: 'photos/cat/1.jpg' });
    expect(entryName(file)).toBe('cat/1.jpg');
    expect(entryName(new File(['x'], 'loose.png'))).toBe('loose.png');
    expect(isRawFile('cat/1.JPG')).toBe(true);
    expect(isRawFile('.DS_Store')).toBe(false);
    expect(isRawFile('notes.txt')).toBe(false);
  });
});

describe('reading a zip the user chose', () => {
  it('lists its entries from the central directory', async () => {
    const data = new TextEncoder().encode('jpeg bytes');
    const blob = zipEntries([{ name: 'circle/001.jpg', data }, { name: 'square/001.jpg', data }, { name: 'notes.txt', data }]);
    expect(await zipEntryNames(blob)).toEqual(['circle/001.jpg', 'square/001.jpg', 'notes.txt']);
    expect(await zipEntryNames(new Blob(['not a zip']))).toEqual([]);
  });

  it('sends for a preview the first file of each class folder and the first few', () => {
    const files = ['circle/1.jpg', 'circle/2.jpg', 'circle/3.jpg', 'circle/4.jpg', 'circle/5.jpg', 'square/1.jpg', 'star/1.jpg'].map((path) => {
      const file = new File(['x'], path.split('/')[1]);
      Object.defineProperty(file, 'webkitRelativePath', { value: `shapes/${path}` });
      return file;
    });
    expect(previewFiles(files).map(entryName)).toEqual(['circle/1.jpg', 'circle/2.jpg', 'circle/3.jpg', 'circle/4.jpg', 'square/1.jpg', 'star/1.jpg']);
  });
});

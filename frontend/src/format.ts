/** Small formatting helpers shared by the pages. */
import type { Shape } from './api/types';

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || Number.isNaN(bytes)) return '—';
  if (bytes < 1024) return `${bytes} B`;
  const units = ['KB', 'MB', 'GB', 'TB'];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(value >= 100 ? 0 : 1)} ${units[unit]}`;
}

export function formatNumber(value: number | null | undefined, digits = 2): string {
  if (value === null || value === undefined || Number.isNaN(value)) return '—';
  return value.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function formatMs(value: number | null | undefined): string {
  if (value === null || value === undefined) return '—';
  return `${formatNumber(value, value < 10 ? 3 : 1)} ms`;
}

export function formatShape(shape: Shape | null | undefined): string {
  if (!shape) return '—';
  return `[${shape.map((dim) => (dim === null || dim === '' ? '?' : String(dim))).join(', ')}]`;
}

export function formatDate(iso: string | null | undefined): string {
  if (!iso) return '—';
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return iso;
  return date.toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' });
}

export function formatRelative(iso: string | null | undefined, now: number = Date.now()): string {
  if (!iso) return 'never';
  const then = new Date(iso).getTime();
  if (Number.isNaN(then)) return iso;
  const seconds = Math.round((now - then) / 1000);
  if (seconds < 5) return 'just now';
  if (seconds < 60) return `${seconds} s ago`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.round(minutes / 60);
  if (hours < 48) return `${hours} h ago`;
  return formatDate(iso);
}

export function percent(fraction: number | null | undefined): string {
  if (fraction === null || fraction === undefined) return '—';
  return `${Math.round(Math.max(0, Math.min(1, fraction)) * 100)}%`;
}

export function humanize(value: string | null | undefined): string {
  if (!value) return '';
  const text = value.replace(/[_-]+/g, ' ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** A scale as people write it: 1/255 rather than 0.00392156862745098 (a whole reciprocal), else the number itself. */
export function formatScale(value: number): string | number {
  if (value > 0 && value < 1) {
    const reciprocal = 1 / value;
    if (Math.abs(reciprocal - Math.round(reciprocal)) < 1e-6 * reciprocal) return `1/${Math.round(reciprocal)}`;
  }
  return value;
}

/** A range at the precision its width needs (three significant digits of the span): "0–335 ms", not "0–334.7297 ms". */
export function formatRange(low: number, high: number, unit = 'ms'): string {
  const span = Math.abs(high - low);
  const decimals = span > 0 ? Math.min(4, Math.max(0, 2 - Math.floor(Math.log10(span)))) : 3;
  return `${formatNumber(low, decimals)}–${formatNumber(high, decimals)} ${unit}`;
}

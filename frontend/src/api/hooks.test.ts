import { describe, expect, it } from 'vitest';
import { totalCount } from './hooks';

describe('totalCount', () => {
  it("is the server's count for a paginated list, beyond the page at hand", () => {
    expect(totalCount({ count: 120, next: '?page=2', previous: null, results: [1, 2, 3] })).toBe(120);
  });

  it('is the number of rows for a plain list, and 0 before anything loaded', () => {
    expect(totalCount([1, 2])).toBe(2);
    expect(totalCount(undefined)).toBe(0);
    expect(totalCount(null)).toBe(0);
  });
});

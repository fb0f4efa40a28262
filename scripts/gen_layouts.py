#!/usr/bin/env python3
"""Transcribes the `| Byte | Bits | Field |` tables of docs/spec/prm-subset.md into
`layout!` invocations (printed to stdout, one block per table name given on the command line).

Used once to write hw/layout/src/*.rs; kept so a new table can be added the same way:
    scripts/gen_layouts.py docs/spec/prm-subset.md cqc create_cq_in > /tmp/out.rs
Hand-written layouts (init segment, CQE, EQE, WQE segments) use other table shapes."""
import re, sys

def camel(n):
    return ''.join(p.capitalize() for p in n.split('_'))

def tables(path):
    lines = open(path).read().split('\n')
    out = {}
    for i, l in enumerate(lines):
        m = re.match(r'^\*\*([a-z_0-9]+)( \(selected\))?\*\* \((\d+) B\)', l)
        if not m:
            continue
        name, size, rows = m.group(1), int(m.group(3)), []
        j = i + 1
        while not lines[j].startswith('| Byte'):
            j += 1
        j += 2
        while j < len(lines) and lines[j].startswith('|'):
            rows.append([c.strip() for c in lines[j].strip('|').split('|')])
            j += 1
        out[name] = (size, rows)
    return out

def field_name(raw):
    raw = raw.split(' ')[0]
    return raw.split('.')[-1]

def emit(name, size, rows):
    print(f'layout! {{')
    print(f'    /// `{name}` ({size} bytes), prm-subset.md.')
    print(f'    pub struct {camel(name)}, "{name}", size {size};')
    seen = set()
    for byte, bits, field in rows:
        fname = field_name(field)
        if fname in seen:
            fname = field.split(' ')[0].replace('.', '_')
        seen.add(fname)
        off = '0x%03x' % int(byte, 16)
        if '→' in field or 'flex' in bits or 'flex' in field:
            const = fname.upper()
            if 'flex' in bits or 'flex array' in field:
                print(f'    {fname}, {const}: {off} flex,')
            else:
                n = int(bits.rstrip('B'))
                print(f'    {fname}, {const}: {off} nested {n},')
        elif bits == '8B':
            print(f'    {fname}, set_{fname}: {off} u64,')
        elif bits.endswith('B'):
            print(f'    {fname}, set_{fname}: {off} [u8; {int(bits[:-1])}],')
        else:
            m = re.match(r'\[(\d+)(?::(\d+))?\]', bits)
            msb = int(m.group(1)); lsb = int(m.group(2) or msb)
            print(f'    {fname}, set_{fname}: {off} [{msb}:{lsb}],')
    print('}\n')

if __name__ == '__main__':
    t = tables(sys.argv[1])
    for n in sys.argv[2:]:
        emit(n, *t[n])

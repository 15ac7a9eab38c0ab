import sys, time, random, torch, torch.nn as nn
torch.set_num_threads(1); torch.manual_seed(0)
D = sys.argv[1] if len(sys.argv) > 1 else '/tmp/arith/data'
depth = int(sys.argv[2]) if len(sys.argv) > 2 else 1
kind = sys.argv[3] if len(sys.argv) > 3 else 'tf'
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
lr = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-3
layers = int(sys.argv[6]) if len(sys.argv) > 6 else 2
voc = {t: i + 2 for i, t in enumerate('0 1 2 3 4 + * ( )'.split())}  # 0 pad 1 cls
def load(split):
    rows = [l.rstrip('\n').split('\t') for l in open(f'{D}/{split}.infix.tsv')][1:]
    dep = [int(x) for x in open(f'{D}/{split}.depth')]
    rows = [(s, int(l)) for (s, l), d in zip(rows, dep) if d == depth or depth == 0]
    global DEP; DEP = torch.tensor([d for d in dep if d == depth or depth == 0])
    L = max(len(s.split()) for s, _ in rows) + 1
    X = torch.zeros(len(rows), L, dtype=torch.long)
    for i, (s, _) in enumerate(rows):
        t = [1] + [voc[w] for w in s.split()]; X[i, :len(t)] = torch.tensor(t)
    return X, torch.tensor([l for _, l in rows])
Xtr, ytr = load("train"); Xte, yte = load("test"); Dte = DEP
L = max(Xtr.shape[1], Xte.shape[1])
Xtr = nn.functional.pad(Xtr, (0, L - Xtr.shape[1])); Xte = nn.functional.pad(Xte, (0, L - Xte.shape[1]))
class TF(nn.Module):
    def __init__(s):
        super().__init__(); s.e = nn.Embedding(11, 64); s.p = nn.Embedding(L, 64); s.ln = nn.LayerNorm(64) if kind.endswith('ln') else nn.Identity()
        s.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, 0.0, batch_first=True, norm_first=(kind=='pre')), layers)
        s.h = nn.Linear(64, 5)
    def forward(s, x):
        h = s.ln(s.e(x) + s.p(torch.arange(x.shape[1])))
        return s.h(s.enc(h, src_key_padding_mask=(x == 0))[:, 0])
class MLP(nn.Module):
    def __init__(s):
        super().__init__(); s.e = nn.Embedding(11, 16); s.m = nn.Sequential(nn.Linear(16 * L, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 5))
    def forward(s, x): return s.m(s.e(x).flatten(1))
class BOW(nn.Module):
    def __init__(s):
        super().__init__(); s.m = nn.Sequential(nn.Linear(11, 256), nn.ReLU(), nn.Linear(256, 5))
    def forward(s, x): return s.m(nn.functional.one_hot(x, 11).float().sum(1))
m = {'mlp': MLP, 'bow': BOW}.get(kind, TF)()
if kind.startswith('tfbert'):  # fairseq's init_bert_params: N(0, 0.02) weights, zero biases
    for mod in m.modules():
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            mod.weight.data.normal_(0, 0.02)
            if getattr(mod, 'bias', None) is not None: mod.bias.data.zero_()
        if isinstance(mod, nn.MultiheadAttention):
            mod.in_proj_weight.data.normal_(0, 0.02); mod.in_proj_bias.data.zero_()
opt = torch.optim.AdamW(m.parameters(), lr, betas=(0.9, 0.98), weight_decay=0.01)
t0 = time.time()
def acc(X, y):
    m.eval()
    with torch.no_grad(): a = (m(X).argmax(-1) == y).float().mean().item()
    m.train(); return a
for step in range(1, steps + 1):
    idx = torch.randint(len(ytr), (32,))
    loss = nn.functional.cross_entropy(m(Xtr[idx]), ytr[idx])
    opt.zero_grad(); loss.backward(); opt.step()
    if step % (steps // 8) == 0:
        print(f'{kind} depth{depth} lr{lr} L{layers} step {step} loss {loss.item():.3f} train {acc(Xtr[:2000], ytr[:2000]):.3f} test {acc(Xte, yte):.3f} d1 {acc(Xte[Dte==1], yte[Dte==1]) if (Dte==1).any() else 0:.3f} {time.time()-t0:.0f}s', flush=True)

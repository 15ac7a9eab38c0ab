import sys,time,random,torch,torch.nn as nn
sp,lr,L,T,seed=sys.argv[1],float(sys.argv[2]),int(sys.argv[3]),float(sys.argv[4]),int(sys.argv[5])
dev='cuda' if torch.cuda.is_available() else 'cpu';torch.manual_seed(seed)
def rt(h,r):
 if h==0:return r.randrange(5)
 t=r.randrange(2);o=r.randrange(h);c=[o,o];c[t]=h-1;return(r.choice('+*'),rt(c[0],r),rt(c[1],r))
def inf(t,top=True):
 if isinstance(t,int):return str(t)
 b=f"{inf(t[1],0)} {t[0]} {inf(t[2],0)}";return b if top else f"( {b} )"
def val(t):
 if isinstance(t,int):return t
 a,b=val(t[1]),val(t[2]);return(a+b)%5 if t[0]=='+' else a*b%5
r=random.Random(1);te=[];seen=set()
for d in(1,2,3):
 n=0
 while n<1000:
  x=rt(d+1,r);s=inf(x)
  if sp=='disjoint' and s in seen:continue
  seen.add(s);te.append((s,val(x),d));n+=1
tr=[]
for d in(1,2,3):
 n=0
 while n<10000:
  x=rt(d+1,r);s=inf(x)
  if sp=='disjoint' and s in seen:continue
  tr.append((s,val(x),d));n+=1
V={w:i+2 for i,w in enumerate('0 1 2 3 4 + * ( )'.split())};M=64
def enc(rows):
 X=torch.zeros(len(rows),M,dtype=torch.long)
 for i,(s,_,_) in enumerate(rows):
  t=[1]+[V[w] for w in s.split()];X[i,:len(t)]=torch.tensor(t)
 return X.to(dev),torch.tensor([v for _,v,_ in rows]).to(dev),torch.tensor([d for _,_,d in rows]).to(dev)
Xa,ya,da=enc(tr);Xe,ye,de=enc(te)
class Mo(nn.Module):
 def __init__(s):
  super().__init__();s.e=nn.Embedding(11,64);s.p=nn.Embedding(M,64);s.n=nn.LayerNorm(64)
  s.t=nn.TransformerEncoder(nn.TransformerEncoderLayer(64,4,128,0.0,'gelu',batch_first=True),L,enable_nested_tensor=False)
  s.h=nn.Sequential(nn.Linear(64,64),nn.Tanh(),nn.Linear(64,5))
 def forward(s,x):
  k=int((x!=0).sum(1).max());x=x[:,:k]
  return s.h(s.t(s.n(s.e(x)+s.p.weight[:k]),src_key_padding_mask=x==0)[:,0])
m=Mo().to(dev);o=torch.optim.AdamW(m.parameters(),lr,betas=(.9,.98),eps=1e-6,weight_decay=.01)
def acc(X,y,d):
 m.eval()
 with torch.no_grad():c=(m(X).argmax(-1)==y).float()
 m.train();return[round(100*c[d==k].mean().item(),1) for k in(1,2,3)]
t0=time.time();st=0
while time.time()-t0<T:
 st+=1;f=min(1,st/500)
 for g in o.param_groups:g['lr']=lr*f
 i=torch.randint(len(ya),(32,),device=dev);l=nn.functional.cross_entropy(m(Xa[i]),ya[i]);o.zero_grad();l.backward();o.step()
 if st%2500==0:print(sp,lr,L,seed,'step',st,'train',acc(Xa[::10],ya[::10],da[::10]),'test',acc(Xe,ye,de),int(time.time()-t0),flush=True)
print(sp,lr,L,seed,'END step',st,'train',acc(Xa[::10],ya[::10],da[::10]),'test',acc(Xe,ye,de),flush=True)

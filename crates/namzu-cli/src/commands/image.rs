//! `image pull|import|ls|rm|prune`: root filesystem images of the
//! daemonless tiers (local, microvm), and the pull `--image` makes on them
//! when the cache lacks the image, with a bar per layer.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Subcommand;
use namzu::image::{ImageStore, Platform, PullEvent, PullOptions};

use crate::fail::Fail;
use crate::ui::progress;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Pull an image from its registry (`alpine`, `ghcr.io/org/app:1`,
    /// `127.0.0.1:5000/x@sha256:…`), with credentials from docker's config.
    Pull {
        reference: String,
        #[command(flatten)]
        opts: PullArgs,
    },
    /// Import a `docker save` tarball or an OCI image layout (tar or directory).
    Import {
        file: PathBuf,
        /// Name to give it (default: the names it carries).
        #[arg(long)]
        name: Option<String>,
    },
    /// List images: name, id, registry digest, unpacked size.
    Ls,
    /// Remove names, and each image once no name is left (or by id).
    Rm {
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Remove what no image needs (unused layers, unfinished downloads,
    /// unnamed images); with --max-size, then the least recently used
    /// images until the cache fits.
    Prune {
        /// Bound on the cache, in bytes (suffixes K, M, G).
        #[arg(long, value_parser = parse_size)]
        max_size: Option<u64>,
    },
}

/// How a pull is made.
#[derive(clap::Args, Clone, Default)]
pub struct PullArgs {
    /// The platform to pick from a multi-platform image (default: this host's).
    #[arg(long)]
    platform: Option<Platform>,
    /// A registry (`host:port`) to speak plain HTTP to; loopback ones always are.
    #[arg(long = "insecure-registry")]
    insecure: Vec<String>,
}

impl PullArgs {
    fn options(&self) -> PullOptions {
        let mut o = PullOptions::default();
        if let Some(p) = &self.platform {
            o.platform = p.clone();
        }
        o.insecure_registries = self.insecure.clone();
        o
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.trim().chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or a number with K, M or G)"))
}

fn store(state_dir: &Option<PathBuf>) -> ImageStore {
    ImageStore::new(state_dir.clone().unwrap_or_else(namzu::backend::default_state_dir))
}

pub async fn run(state_dir: &Option<PathBuf>, cmd: ImageCmd) -> Result<ExitCode, Fail> {
    match cmd {
        ImageCmd::Pull { reference, opts } => {
            let store = store(state_dir).with_pull_options(opts.options());
            let bars = Bars::default();
            let shown = bars.clone();
            let info = store.pull(&reference, &move |e| shown.event(e)).await;
            bars.clear();
            let info = info?;
            println!(
                "{} {} {}",
                info.names.join(" "),
                info.id,
                info.digest.as_deref().unwrap_or("-")
            );
            Ok(ExitCode::SUCCESS)
        }
        ImageCmd::Import { file, name } => import(state_dir, file, name).await,
        ImageCmd::Ls => {
            for i in store(state_dir).list()? {
                let names = if i.names.is_empty() {
                    vec!["<none>".to_owned()]
                } else {
                    i.names
                };
                for n in names {
                    println!(
                        "{n}\t{}\t{}\t{}",
                        i.id,
                        i.digest.as_deref().unwrap_or("-"),
                        indicatif::HumanBytes(i.size)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCmd::Rm { references } => {
            let store = store(state_dir);
            for r in references {
                let gone = store.remove(&r)?;
                for n in gone.names {
                    println!("untagged {n}");
                }
                for i in gone.images {
                    println!("deleted {i}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCmd::Prune { max_size } => {
            let gone = store(state_dir).prune(max_size, &[])?;
            for i in &gone.images {
                println!("deleted {i}");
            }
            println!("freed {}", indicatif::HumanBytes(gone.bytes));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Pulls `reference` for `--image` on a daemonless tier unless the cache
/// has it, with a bar per layer on stderr.
pub async fn ensure(state_dir: &Option<PathBuf>, reference: &str) -> Result<(), Fail> {
    let store = store(state_dir);
    if store.resolve(reference).is_ok() || namzu::image::canonical(reference).is_none() {
        return Ok(());
    }
    let bars = Bars::default();
    let shown = bars.clone();
    let r = store.ensure(reference, &move |e| shown.event(e)).await;
    bars.clear();
    r.map(|_| ()).map_err(Fail::from)
}

/// [`ensure`] from a caller without a runtime (the one-command path): the
/// cached case costs one lookup, no runtime.
pub fn ensure_blocking(state_dir: &Option<PathBuf>, reference: &str) -> Result<(), Fail> {
    if store(state_dir).resolve(reference).is_ok() || namzu::image::canonical(reference).is_none() {
        return Ok(());
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Fail(format!("runtime: {e}")))?
        .block_on(ensure(state_dir, reference))
}

/// One bar per layer.
#[derive(Clone, Default)]
struct Bars(Arc<Mutex<BarsInner>>);

#[derive(Default)]
struct BarsInner {
    multi: Option<indicatif::MultiProgress>,
    bars: Vec<(String, indicatif::ProgressBar)>,
}

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

impl Bars {
    fn event(&self, e: PullEvent) {
        let Ok(mut s) = self.0.lock() else { return };
        let multi = s
            .multi
            .get_or_insert_with(|| indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr()))
            .clone();
        let bar = |s: &mut BarsInner, digest: &str, total: u64| -> indicatif::ProgressBar {
            if let Some((_, b)) = s.bars.iter().find(|(d, _)| d == digest) {
                return b.clone();
            }
            let b = multi.add(progress(total, short(digest)));
            s.bars.push((digest.to_owned(), b.clone()));
            b
        };
        match e {
            PullEvent::Resolved { layers, .. } => {
                for (d, size) in layers {
                    bar(&mut s, &d, size);
                }
            }
            PullEvent::Blob { digest, done, total } => {
                let b = bar(&mut s, &digest, total);
                b.set_length(total);
                b.set_position(done);
            }
            PullEvent::BlobReady { digest, cached } => {
                let b = bar(&mut s, &digest, 0);
                b.set_message(format!("{} {}", short(&digest), if cached { "cached" } else { "done" }));
                if let Some(len) = b.length() {
                    b.set_position(len);
                }
                b.finish();
            }
            PullEvent::Unpacking => {
                let b = multi.add(crate::ui::spinner("unpacking"));
                s.bars.push(("unpack".into(), b));
            }
        }
    }

    fn clear(&self) {
        if let Ok(s) = self.0.lock() {
            for (_, b) in &s.bars {
                b.finish_and_clear();
            }
            if let Some(m) = &s.multi {
                let _ = m.clear();
            }
        }
    }
}

async fn import(state_dir: &Option<PathBuf>, file: PathBuf, name: Option<String>) -> Result<ExitCode, Fail> {
    let store = store(state_dir);
    let bar = progress(std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0), "import");
    let shown = bar.clone();
    let info =
        tokio::task::spawn_blocking(move || store.import(&file, name.as_deref(), &|done, _| shown.set_position(done)))
            .await
            .map_err(|e| Fail(e.to_string()))?;
    bar.finish_and_clear();
    let info = info?;
    println!("{} {}", info.id, info.names.join(" "));
    Ok(ExitCode::SUCCESS)
}

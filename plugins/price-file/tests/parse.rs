//! The price file's parsing: SkyPilot's own column orders, zones folded into regions,
//! every bad row named by its line.

use price_file::parse;
use runner_plugin_sdk::cost::*;

#[test]
fn skypilot_aws_and_lambda_orders_both_parse() {
    let aws = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch\n\
               p5.48xlarge,H100,8.0,192,2048,\"{'Gpus': [{'Name': 'H100'}]}\",40.0,20.0,us-east-1,use1-az1,x86_64\n\
               p5.48xlarge,H100,8.0,192,2048,,40.0,15.0,us-east-1,use1-az2,x86_64\n\
               p5.48xlarge,H100,8.0,192,2048,,42.0,,us-west-2,usw2-az1,x86_64\n";
    let o = parse(aws).unwrap();
    assert_eq!(o.len(), 1);
    let spot: Vec<f64> = o[0].prices.iter().filter(|p| p.option == PurchaseOption::Spot).map(|p| p.usd_per_node_hour).collect();
    assert_eq!(spot, vec![15.0], "the lowest zone's spot price");
    assert_eq!(o[0].prices.iter().filter(|p| p.option == PurchaseOption::OnDemand).count(), 2);
    let lambda = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice,Reserved1yPrice,EffectiveDate,Source\n\
                  gpu_8x_h100,H100,8,208,1800,24.0,us-east-1,,,19.5,2026-11-01,our contract #42\n";
    let o = parse(lambda).unwrap();
    let r = o[0].prices.iter().find(|p| p.option == PurchaseOption::OneYearNoUpfront).unwrap();
    assert_eq!(r.effective_date, "2026-11-01");
    assert!(r.source.starts_with("our contract #42") && r.source.contains("line 2"));
    assert_eq!((r.billing_increment_s, r.minimum_charge_s), (8760 * 3600, 8760 * 3600), "a committed term bills whole terms");
    // Saved from Excel as "CSV UTF-8": a byte-order mark before the header.
    let bom = format!("\u{feff}{lambda}");
    let b = parse(&bom).unwrap();
    assert_eq!((b.len(), b[0].instance.as_str(), b[0].prices.len()), (1, "gpu_8x_h100", o[0].prices.len()));
}

#[test]
fn every_bad_row_is_named_by_its_line() {
    let bad = "InstanceType,AcceleratorName,AcceleratorCount,Price,Region\n\
               ok,H100,8,30,r1\n\
               ,H100,8,30,r1\n\
               x,H100,eight,30,r1\n\
               y,H100,8,-3,r1\n\
               z,H100,8,30\n";
    let e = parse(bad).unwrap_err();
    for line in ["line 3", "line 4", "line 5", "line 6"] {
        assert!(e.contains(line), "{line}: {e}");
    }
    assert!(!e.contains("line 2"), "{e}");
    assert!(parse("Instance,Price\n").unwrap_err().contains("unknown column 'Instance'"));
    assert!(parse("").unwrap_err().contains("header"));
}

/// The contract's own rules (a price under a tenth of a cent, a control character in a
/// name) name the row's line too, not only the instance.
#[test]
fn rows_the_contract_refuses_are_named_by_their_line() {
    let e = parse("InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nok,H100,8,r1,30\nmy-8xh100,H100,8,eu-1,1e-9\n").unwrap_err();
    assert!(e.contains("line 3: instance 'my-8xh100' in 'eu-1' (on-demand): 1e-9 USD/node-hour is under a tenth of a cent"), "{e}");
    let e = parse("InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nmy-\u{1b}[31mred,H100,8,r1,30\n").unwrap_err();
    assert!(e.contains("line 2: instance 'my-\\u{1b}[31mred' contains the control character U+001B"), "{e}");
}

#[test]
fn caveats_are_read_and_unknown_ones_named() {
    let csv = "InstanceType,AcceleratorName,AcceleratorCount,Price,Region,Caveats\n\
               cheap,H100,8,10,r1,suspect; resale\n\
               fair,H100,8,20,r1,\n";
    let o = parse(csv).unwrap();
    assert_eq!(o[0].prices[0].caveats, vec![PriceCaveat::Suspect, PriceCaveat::Resale]);
    assert!(o[1].prices[0].caveats.is_empty());
    let e = parse("InstanceType,AcceleratorName,AcceleratorCount,Price,Region,Caveats\nx,H100,8,10,r1,dodgy\n").unwrap_err();
    assert!(e.contains("line 2") && e.contains("'dodgy'"), "{e}");
}

/// RFC 4180: a quoted cell may hold a line break; the record keeps the line it starts on
/// (later rows' line numbers stay the file's), and the break reads as a space.
#[test]
fn a_quoted_cell_may_span_lines() {
    let text = "InstanceType,AcceleratorName,AcceleratorCount,Price,Region,Source\n\
                gpu_8x_h100,H100,8,24.0,us-east-1,\"our contract,\nsigned 2026-11\"\n\
                # a comment between records\n\
                bad,H100,8,-1,us-east-1,x\n";
    let e = parse(text).unwrap_err();
    assert!(e.contains("line 5") && !e.contains("line 2") && !e.contains("line 3"), "{e}");
    let o = parse(&text.replace(",-1,", ",30,")).unwrap();
    assert_eq!(o.len(), 2);
    assert!(o[0].prices[0].source.starts_with("our contract, signed 2026-11"), "{}", o[0].prices[0].source);
    // Three lines, escaped quotes in the first ("" counts two) and none in the second:
    // the cell stays open until a line with an odd count of quotes closes it.
    let text = "InstanceType,AcceleratorName,AcceleratorCount,Price,Region,Source\n\
                a,H100,8,24.0,r1,\"the \"\"gold\"\" deal\nrenewed\nyearly\"\n\
                b,H100,8,-1,r1,x\n";
    let e = parse(text).unwrap_err();
    assert!(e.contains("line 5: Price '-1'") && !e.contains("line 2"), "{e}");
    let o = parse(&text.replace(",-1,", ",30,")).unwrap();
    assert_eq!(o[0].prices[0].source, "the \"gold\" deal renewed yearly (the user's price file, line 2)");
}

/// A file past the contract's 4096 instances stops at the first one too many, naming it
/// and its line; a file broken throughout (a wrong file) stops after 1000 problems. Both
/// used to read to the end: a price file of 40,000 instances took 15 s natively (past the
/// plugin's 10 s deadline in the sandbox), its instances found by a scan of those before.
#[test]
fn an_oversized_or_wrong_file_stops_where_it_goes_wrong() {
    const H: &str = "InstanceType,AcceleratorName,AcceleratorCount,Price,Region\n";
    let rows = |n: usize, price: &str| -> String { (0..n).map(|i| format!("i{i},H100,8,{price},r1\n")).collect() };
    assert_eq!(parse(&format!("{H}{}", rows(4096, "30"))).unwrap().len(), 4096);
    let e = parse(&format!("{H}{}", rows(4100, "30"))).unwrap_err();
    assert_eq!(
        e,
        "price file: line 4098: instance 'i4096' is one more than the 4096 instances a price list holds: keep the instances \
         you would run on"
    );
    // One instance in 1025 regions: its 1025th price is one too many.
    let regions: String = (0..1100).map(|i| format!("x,H100,8,30,r{i}\n")).collect();
    let e = parse(&format!("{H}{regions}")).unwrap_err();
    assert!(e.starts_with("price file: line 1026: instance 'x' in r1024 is one price more than the 1024"), "{e}");
    let e = parse(&format!("{H}{}", rows(1500, "-1"))).unwrap_err();
    assert!(e.starts_with("price file: line 2: Price '-1' is not above zero"), "{e}");
    assert!(e.ends_with("; and 981 more"), "20 shown of 1000 and the stop: {e}");
    // The stop is itself listed last of the 1001 problems; the 20 shown are the first.
    assert_eq!(e.matches("Price '-1'").count(), 20, "{e}");
    let all = parse(&format!("{H}{}", rows(999, "-1"))).unwrap_err();
    assert!(all.ends_with("; and 979 more") && !all.contains("stopped"), "{all}");
}

/// Each malformed file a provider or a spreadsheet writes names its line and how to write
/// it instead; none prices with a row dropped or a second price picked in silence.
#[test]
fn malformed_files_name_the_line_and_the_fix() {
    const H: &str = "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice,EffectiveDate,Source\n";
    let err = |rows: &str| parse(&format!("{H}{rows}")).unwrap_err();
    // Money as people write it: the plain number it should be, one problem per cell.
    let e = err("x,H100,8,r1,$3.50,,2026-01-01,src\n");
    assert!(e.contains("line 2: Price '$3.50' is not a plain number: write 3.50"), "{e}");
    assert!(!e.contains("has no price"), "one problem, said once: {e}");
    assert!(err("x,H100,8,r1,\"3,50\",,2026-01-01,src\n").contains("Price '3,50' is not a plain number: write 3.50"));
    assert!(err("x,H100,8,r1,\"1,234.50\",,2026-01-01,src\n").contains("write 1234.50"));
    assert!(err("x,H100,8,r1,24 USD,,2026-01-01,src\n").contains("write 24 "));
    // A hex or letter-bearing cell has no plain number to suggest ("0x10" is not 010).
    let e = err("x,H100,8,r1,0x10,,2026-01-01,src\n");
    assert!(e.contains("line 2: Price '0x10' is not a number: write the price") && !e.contains("write 010"), "{e}");
    assert!(err("x,H100,8,r1,0,,2026-01-01,src\n").contains("line 2: Price '0' is not above zero"));
    assert!(err("x,H100,8,r1,inf,,2026-01-01,src\n").contains("Price 'inf' is not a finite number"));
    assert!(err("x,H100,8,r1,1e300,,2026-01-01,src\n").contains("line 2: Price '1e300' is above 1e9 USD per node-hour"));
    // An unquoted decimal comma shifts the cells: the spot price then reads above on-demand.
    let e = err("x,H100,8,r1,3,50,2026-01-01,src\n");
    assert!(e.contains("line 2: SpotPrice 50 is above the on-demand Price 3") && e.contains("swapped"), "{e}");
    assert!(err("x,H100,8,r1,20,,2026-01-01,src,more\n").contains("must be in double quotes"));
    // Dates that are not dates, on their line.
    assert!(err("x,H100,8,r1,20,,2026-02-30,src\n").contains("line 2: EffectiveDate '2026-02-30' is not a date written YYYY-MM-DD"));
    // One message per bad cell: the contract's own date check does not repeat it.
    let e = err("d,H100,8,eu-1,20,,2026/11/15,src\n");
    assert_eq!(e, "price file: line 2: EffectiveDate '2026/11/15' is not a date written YYYY-MM-DD (e.g. 2026-11-15)");
    // A column named twice: which one holds the price is the user's to say.
    let e = parse("InstanceType,AcceleratorName,AcceleratorCount,Region,Price,Price\nx,H100,8,eu-1,18.40,1.00\n").unwrap_err();
    assert_eq!(e, "price file: line 1: column 'Price' appears twice (columns 5 and 6): keep one");
    let e = parse("Region,InstanceType,AcceleratorName,AcceleratorCount,Region,Price,Region\nr,x,H100,8,r,18.40,r\n").unwrap_err();
    assert_eq!(e.matches("appears twice").count(), 1, "one message per repeated name: {e}");
    // A quote never closed swallows the rest of the file: refused, not read as one cell.
    let e = err("x,H100,8,r1,20,,2026-01-01,\"our contract\ny,H100,8,r2,30,,2026-01-01,src\n");
    assert!(e.contains("line 2: a quoted cell opens here and is never closed"), "{e}");
    // Two rows for one instance and region: which price holds is the user's to say.
    let e = err("x,H100,8,r1,20,,2026-01-01,src\nx,H100,8,r1,18,,2026-01-01,src\n");
    assert!(e.contains("line 3: instance 'x' in r1 is already priced on line 2"), "{e}");
    // SkyPilot's "A100" is the 40 GB part; the runner's alias the 80 GB one.
    assert!(err("p4d.24xlarge,A100,8,r1,20,,2026-01-01,src\n").contains("write A100-40GB or A100-80GB"));
    // Headers: a case slip names the right spelling; a semicolon file says to save with commas.
    let e = parse("instancetype,AcceleratorName,AcceleratorCount,Region,Price\nx,H100,8,r1,20\n").unwrap_err();
    assert!(e.contains("unknown column 'instancetype': write 'InstanceType'"), "{e}");
    assert_eq!(e.matches("the known columns are").count(), 1, "{e}");
    let e = parse("InstanceType;AcceleratorName;AcceleratorCount;Region;Price\nx;H100;8;r1;20\n").unwrap_err();
    assert!(e.contains("separated by semicolons: save it with commas"), "{e}");
    assert!(parse(H).unwrap_err().contains("line 1: the file has a header and no rows"));
    // What stays accepted: Windows line ends after a byte-order mark, a quoted comma.
    let o = parse(&format!("\u{feff}{}x,H100,8,r1,20,,2026-01-01,\"contract, schedule B\"\r\n", H.replace('\n', "\r\n"))).unwrap();
    assert_eq!((o[0].prices[0].usd_per_node_hour, o[0].prices[0].source.starts_with("contract, schedule B")), (20.0, true));
}

/// SkyPilot's names for a runner GPU under another name are priced as that GPU (GCP's
/// a3-megagpu-8g is `H100-MEGA` in SkyPilot's catalog: its rows matched no GPU type and were
/// never priced); a different part keeps its own name.
#[test]
fn skypilot_gpu_names_of_known_chips_are_priced_as_them() {
    let csv = "InstanceType,AcceleratorName,AcceleratorCount,Price,Region\n\
               a3-megagpu-8g,H100-MEGA,8.0,92.21,us-central1\n\
               runpod-8x-a100,A100-80GB-SXM,8,14.0,CA\n\
               a3-highgpu-8g,H100,8,88.0,us-central1\n\
               sxm-node,H100-SXM,8,30.0,r1\n\
               nvl-node,H100-NVL,8,25.0,r1\n";
    let gpus: Vec<(String, String)> = parse(csv).unwrap().into_iter().map(|o| (o.instance, o.gpu)).collect();
    let expect = [("a3-megagpu-8g", "H100"), ("runpod-8x-a100", "A100-80GB"), ("a3-highgpu-8g", "H100"), ("sxm-node", "H100-SXM"), ("nvl-node", "H100-NVL")];
    assert_eq!(gpus, expect.map(|(i, g)| (i.to_string(), g.to_string())));
}
